"""The §3 analysis in the toy model: exact gradients, where training with each KL setup ends, the frameworks' atlas.

    toy            the parametric autoregressive model of §3.3: exact KL gradients, Monte Carlo bias and variance
    fixed_points   where each configuration's expected update ends, against the exact optimum of J_β; β_eff
    monte_carlo    the toy trained by sampling as the trainer trains: end points, their agreement, claims, tables
    presets        what each framework ships as its KL setup, by version, read from its code at release tags
    atlas          the frameworks' KL setups with advantage normalisation and group size, in effective β

Its claims are judged by the core's rule (claims_rule.py), as the runs' are; its figures are drawn by report/figures.

May import: core.
"""
