"""klstudy: a reproducible pipeline for "A Comedy of Estimators: On KL Regularization in RL Training of LLMs"."""

__version__ = "0.1.0"
