"""A small synthetic study for the figure tests: every study of config.yaml with results in the aggregated tables'
columns (cells, training, heldout, evaluations, divergence) and a claims table about them; drawn in seconds."""

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from klstudy.config import validate_config

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["math500", "math_squared", "mmlu_college_physics", "mmlu_college_chemistry", "mmlu_college_biology"]
# KL at the end of training per configuration and β (means over seeds): K1 in the reward falls clearly with β.
ENDS = {"none": 1.0, "k1-reward": 0.5, "k1-loss": 1.1, "k3-reward": 0.85, "k3-loss": 0.35, "k1-both": 0.45,
        "k3-both": 0.4}  # fmt: skip


def study_config(seeds: int = 2) -> dict:
    """config.yaml, the on-policy study with ``seeds`` seeds and the configurations ENDS knows."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["studies"]["onpolicy"]["seeds"] = list(range(seeds))
    config["studies"]["onpolicy"]["kl"] = ["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss"]
    return validate_config(config)


def identity(kl, beta, seed, study="onpolicy", model="tiny"):
    estimator, _, placement = kl.partition("-")
    return dict(study=study, model=model, kl=kl, estimator=estimator, placement=placement or "none", beta=beta,
                seed=seed)  # fmt: skip


def study_tables(config: dict, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Results for every cell of every study: training steps, held-out evaluations (step 0 the base model, one value
    per seed), lm-eval evaluations of the evaluated cells and the base model, and Fig. 12's divergence."""
    rng = np.random.default_rng(seed)
    cells, training, heldout, evaluations, divergence = [], [], [], [], []
    base_by_seed = {}
    for name, study in config["studies"].items():
        train = study["train"]
        betas = study["betas"]
        for kl in study["kl"]:
            for beta in [0.0] if kl == "none" else betas:
                for s in study["seeds"]:
                    cell = identity(kl, float(beta), s, name, study["models"][0])
                    status = "collapsed" if (name, kl, beta, s) == ("onpolicy", "k3-reward", 1.0, 1) else "ok"
                    cells.append({**cell, "status": status})
                    end = ENDS.get(kl.rsplit("-", 1)[0] if kl.count("-") == 2 else kl, 0.8) / (1 + float(beta))
                    for step in range(1, train["steps"] + 1):
                        lagged = max(0, step - train.get("async_level", 0) - 1) / train["steps"]
                        training.append({**cell, "step": step, "kl_k3": end * lagged + abs(rng.normal(0, 0.03)),
                                         "task_reward": 0.3 + rng.normal(0, 0.05),
                                         "grad_norm": 1 + rng.normal(0, 0.2)})  # fmt: skip
                    base = base_by_seed.setdefault((study["heldout_data"], s), 0.3 + rng.normal(0, 0.02))
                    for step in range(0, train["steps"] + 1, train.get("eval_every", 5)):
                        value = base if step == 0 else float(np.clip(0.3 + rng.normal(0, 0.05), 0, 1))
                        heldout.append({**cell, "step": step, "pass_at_1": value, "stderr": 0.045, "prompts": 100,
                                        "samples": 1})  # fmt: skip
                    if kl in config["evaluation"]["studies"].get(name, []):
                        for task in TASKS:
                            evaluations.append({**cell, "chat_template": "on", "task": task,
                                                "mean_at_k": 0.3 + rng.normal(0, 0.03), "stderr": 0.04, "unread": 0.1,
                                                "k": 4, "cell_status": "ok"})  # fmt: skip
                    divergence_cell = (name == config["divergence"]["study"] and kl in config["divergence"]["kl"]
                                       and float(beta) in config["divergence"]["betas"]
                                       and s in config["divergence"]["seeds"])  # fmt: skip
                    if divergence_cell:
                        for task in config["divergence"]["tasks"]:
                            for step in config["divergence"]["steps"]:
                                divergence.append({**cell, "task": task, "step": step,
                                                   "forward_kl": 0.01 * step + abs(rng.normal(0, 0.01)),
                                                   "forward_kl_stderr": 0.005, "entropy": 0.2 + rng.normal(0, 0.005),
                                                   "entropy_stderr": 0.01})  # fmt: skip
    for template in ("on", "off"):
        for task in TASKS:
            evaluations.append({**identity("base", 0.0, 0, "base"), "kl": "base", "chat_template": template,
                                "task": task, "mean_at_k": 0.25 if template == "on" else 0.0, "stderr": 0.04,
                                "unread": 0.1, "k": 4, "cell_status": "base"})  # fmt: skip
    return {"cells": pd.DataFrame(cells), "training": pd.DataFrame(training), "heldout": pd.DataFrame(heldout),
            "evaluations": pd.DataFrame(evaluations), "divergence": pd.DataFrame(divergence)}  # fmt: skip


def claims_table(config: dict, verdict: str = "not shown") -> pd.DataFrame:
    """A claims table with a row per claim of the config and per β of its study (the columns figures read); every
    verdict the given one, but for claims of one seed ("not testable: one seed", no interval)."""
    rows = []
    for name, claim in config["claims"].items():
        study = config["studies"][claim["study"]]
        seeds = len(study["seeds"])
        betas = [0.0] if claim["candidate"] == "none" else study["betas"]
        for beta in betas:
            testable = seeds > 1
            rows.append(dict(claim=name, text=claim["text"], metric=claim["metric"], study=claim["study"],
                             model="tiny", candidate=claim["candidate"], baseline=claim["baseline"], beta=beta,
                             baseline_beta="", predicted=claim["predicted"].replace("table1", "lower"),
                             effect=-0.05, se=0.04 if testable else np.nan, z=1.2 if testable else np.nan,
                             critical=31.82 if testable else np.nan, verdict=verdict if testable else
                             "not testable: one seed", units=seeds, seeds=seeds, pair_by=claim.get("pair_by", "seeds"),
                             note="", baseline_mean=0.5, candidate_mean=0.45))  # fmt: skip
    return pd.DataFrame(rows)
