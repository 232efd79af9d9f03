"""What a run shows: tidy tables of the grid, the study's tables, the claims and their verdicts, every figure.

    aggregate     tidy tables of everything the grid produced (missing cells included), and the uncertainty convention
    tables        Table 1 with the runs' behaviour, Table 2, evaluation differences, regularisation, evaluations
    claims        the claims table: each of the paper's claims, its paired effect and error, one row per model and β,
                  judged by the core's rule (claims_rule.py)
    figures/      every figure, one module per family, one encoding for all

May import: core, analysis, data, train, evaluate.
"""
