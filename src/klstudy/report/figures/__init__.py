"""Every figure of the study, drawn from tidy result tables (aggregate.py's, and the toy analysis's: never typed-in
numbers); the study's tables themselves are tables.py's.

    encoding   the one encoding every figure shares (colour, marker, line style, hatch), names, saving
    captions   a caption's numbers read from the drawn artists, and the conventions every caption shares
    series     one series drawn as its noise is (one seed, a few, many), and the base model's one measurement
    panels     the panels of the config's ``figures`` section, one function per kind (curves, bars, divergence, KL)
    paper      those figures: their panels laid out, with the claims' verdicts on them
    training   each study's training dynamics: reward, KL and gradient norm over steps
    forest     the claims figure: every claim's effect ± critical·se, coloured by its verdict
    toy        the toy model's: Figure 1, and where each configuration's training ends against the optimum
    atlas      the atlas's: how strongly each framework's KL setup regularises (β_eff against β), and its helpers
    atlas_length  the atlas's length sweep (β_eff against the answer's length), and both figures written together
    redraw     every figure of a shipped folder from its tables/ (`klstudy redraw`), and figures/README.md
"""

import matplotlib

matplotlib.use("Agg")  # every figure is written to a file: no display is needed, none is assumed
