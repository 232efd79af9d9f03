"""The §3 analysis in the toy model: exact gradients, where training with each KL setup ends, the frameworks' atlas.

    toy              the parametric autoregressive model of §3.3: exact KL gradients, Monte Carlo bias and variance
    fixed_points     where each configuration's expected update ends, against the exact optimum of J_β
    effective_beta   the optimum's KL against β, and its inverse: an end point's β_eff and its gap to the frontier
    monte_carlo      the toy trained by sampling as the trainer trains: end points, their agreement, claims, tables
    explain          `klstudy explain`: what a framework's setting, or any setting, amounts to, computed in the toy
    atlas            the frameworks' KL setups with advantage normalisation and group size, in effective β
    answer           the answer first: which setups end on the optimum, and each framework release's table

Its claims are judged by the core's rule (claims_rule.py), as the runs' are; its figures are drawn by report/figures.

May import: core.
"""
