"""klstudy: a reproducible pipeline for "A Comedy of Estimators: On KL Regularization in RL Training of LLMs".

The package is the pipeline, one subpackage per stage, in layers listed from the bottom up: a module imports from its
own layer and from the layers before it in this list, never from one after it (tests/test_layers.py reads this list
and holds the code to it, circles of imports included).

    core       kl.py (the KL estimators and placements: the paper's Table 1, written once), config.py (validation,
               the study grid, paths), claims_rule.py (the rule every claim is judged by, fixed in advance),
               environment.py (every environment variable read, declared once), progress.py (progress lines of a
               job's log), frameworks.py (what each framework ships as its KL setup, by version),
               framework_settings.py (a user's setting in its framework's own words, read as a KL setting),
               figure_plan.py (which figures a run draws)
    analysis   the §3 analysis in the toy model: exact gradients, where training ends (exact and sampled), the atlas
    data       the datasets as staged JSONL records (the Hub's, or procedural stand-ins), prompts, verifiable rewards
               and the readers of a completion's answer
    train      the RL trainer beside its config, one grid cell end to end, base models, trackers, vLLM on a CPU
    evaluate   lm-eval-harness on klstudy's tasks, forward KL and entropy of training snapshots (Fig. 12)
    report     the grid's tidy tables, the study's tables, the claims table, every figure
    run        the `klstudy` command: a subcommand per stage, the driver, warm workers, status, preflight, cost, the
               configuration reference

What a user's script needs is imported from here: ``from klstudy import KLTrainer, KLTrainerConfig, kl``.
"""

__version__ = "0.2.0"
__all__ = ["KLTrainer", "KLTrainerConfig", "kl"]

# The trainer imports torch, transformers and TRL (seconds): only a script that asks for it pays for them, not a job
# that reads a table or draws a figure.
_LAZY = {"KLTrainer": "klstudy.train.trainer", "KLTrainerConfig": "klstudy.train.trainer", "kl": "klstudy.kl"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'klstudy' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_LAZY[name])
    return module if module.__name__ == f"klstudy.{name}" else getattr(module, name)
