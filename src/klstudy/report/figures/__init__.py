"""Every figure of the study, drawn from tidy result tables (aggregate.py's, and the toy analysis's: never typed-in
numbers); the study's tables themselves are tables.py's. Each module's docstring says which figures it draws."""

import matplotlib

matplotlib.use("Agg")  # every figure is written to a file: no display is needed, none is assumed
