"""Helpers shared by the workflow tests: running Snakemake, and the reduced embedded study."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def snakemake(*args, cwd=ROOT, timeout=600):
    run = subprocess.run(
        [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(cwd), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout + run.stderr


def without_times(table):
    """A table of a run without the columns that measure time or memory (they differ from run to run)."""
    from klstudy.train.cell import MEASURED_COLUMNS

    return table.drop(columns=[c for c in MEASURED_COLUMNS if c in table.columns])


def assert_same_results(reference: Path, workdir: Path, config: dict) -> None:
    """The study in ``workdir`` has the tables and toy results of the one in ``reference`` (times aside)."""
    import pandas as pd

    def read(directory: Path, name: str) -> pd.DataFrame:
        return without_times(pd.read_csv(directory / "results" / "tables" / f"{name}.csv"))

    for name in ("cells", "heldout", "training", "evaluations", "divergence"):
        pd.testing.assert_frame_equal(read(reference, name), read(workdir, name), obj=name)
    assert len(read(reference, "training")) > 0 and read(reference, "evaluations").mean_at_k.notna().all()
    for setting in config["toy"]["settings"]:
        pd.testing.assert_frame_equal(
            *(pd.read_csv(d / "results" / "toy" / f"{setting}.csv") for d in (reference, workdir))
        )


def job_counts(output: str) -> dict:
    table = output.split("Job stats:")[1].split("total")[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def expected_jobs(config: dict) -> dict:
    """Job counts per rule, computed from the config independently of the workflow's helpers."""
    trained = evaluated = 0
    for study, spec in config["studies"].items():
        per_config = {kl: (1 if kl == "none" else len(spec["betas"])) * len(spec["seeds"]) for kl in spec["kl"]}
        trained += len(spec["models"]) * sum(per_config.values())
        if study in config["evaluation"]["studies"]:
            evaluated += len(spec["models"]) * sum(per_config[kl] for kl in config["evaluation"]["studies"][study])
    per_model = config["evaluation"].get("jobs", "per_task") == "per_model"
    tasks = 1 if per_model else len(config["evaluation"]["tasks"])  # evaluation jobs per model
    base_models = {m for s in config["evaluation"]["studies"] for m in config["studies"][s]["models"]}
    div = config["divergence"]
    div_models = div.get("models") or config["studies"][div["study"]]["models"]
    fixed_points = config["toy"].get("fixed_points", {})  # every key has a default: the two families, MC on tabular
    monte_carlo = fixed_points.get("monte_carlo", {})
    return {
        "toy_bias_variance": len(config["toy"]["settings"]),
        "toy_unbiasedness": 1,
        "fig01": 1,
        "toy_fixed_points": len(fixed_points.get("families", ["tabular", "parametric"])),
        "toy_monte_carlo": 2 * len(monte_carlo.get("families", ["tabular"])),  # on- and off-policy
        "toy_fixed_points_report": 1,
        # the atlas: one job per family and one for the length sweep, then its report
        "toy_atlas": len(config["toy"].get("atlas", {}).get("families", ["tabular", "parametric"])) + 1,
        "toy_atlas_report": 1,
        "prepare_data": len(config["data"]),
        "base_model": len(config["models"]),
        "train_rl": trained,
        "evaluate_cell": evaluated * tasks,
        "evaluate_base": len(base_models) * 2 * tasks,
        "divergence": len(div_models) * len(div["kl"]) * len(div["betas"]) * len(div["seeds"]) * len(div["tasks"]),
        "aggregate": 1,
        "figure": len(config["figures"]),
        "claims_figure": len(forest_metrics(config)),
        "training_figure": len(training_studies(config)),
        "figures_readme": 1,
        "study_tables": 1,
        "all": 1,
    }


def forest_metrics(config: dict) -> set[str]:
    """The metrics with a claim of two paired seeds or more: a forest each."""
    metrics = set()
    for claim in config["claims"].values():
        seeds = set(config["studies"][claim["study"]]["seeds"])
        if claim["baseline"] != "base":
            seeds &= set(config["studies"][claim.get("baseline_study", claim["study"])]["seeds"])
        if claim["metric"] in ("forward_kl", "entropy"):
            seeds &= set(config["divergence"]["seeds"])
        metrics |= {claim["metric"]} if len(seeds) > 1 else set()
    return metrics


def training_studies(config: dict) -> list[str]:
    """The studies with a training figure: not trained on their lag alone, and with no KL or a claim's baseline."""
    drawn = []
    for study, spec in config["studies"].items():
        train = spec["train"]
        lag_only = train.get("async_level", 0) and train["steps"] <= train["async_level"] + 1
        baselines = {c["baseline"] for c in config["claims"].values()
                     if c["study"] == study and c.get("baseline_study", study) == study}  # fmt: skip
        if not lag_only and ("none" in spec["kl"] or baselines & set(spec["kl"])):
            drawn.append(study)
    return drawn


def claims_it_can_test(config: dict) -> dict:
    """The config's claims that its (reduced) grid can still test: a claim naming a study or configuration the
    grid no longer has is refused by validation, as a user's would be. The grid is validated once, each claim
    alone (validating the whole config per claim took a second per reduced config)."""
    from klstudy import config as configuration

    schema = configuration.load_schema()
    grid = configuration.validate_config(json.loads(json.dumps({**config, "claims": {}})), schema)
    kept = {}
    for name, claim in config.get("claims", {}).items():
        try:
            filled = configuration.section_settings("claims", json.loads(json.dumps(claim)), name, schema)
            configuration.check_claim(grid, filled, f"claims.{name}")
        except configuration.ConfigError:
            continue
        kept[name] = claim
    return kept


def validated_cell(
    train: dict, study="test", kl="k1-loss", beta=0.1, seed=0, health=None, snapshot_steps=(), snapshot_dtype="base"
) -> dict:
    """A cell's settings exactly as the workflow hands them to `klstudy train` (config.cell_settings): one study of
    config.yaml's tiny model with these train settings, validated, so that every default comes from the schema.
    ``health``: its rules (the collapse rule off unless given, as it could not fire in a short test run)."""
    from klstudy.config import cell_settings, validate_config

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["studies"] = {study: dict(models=["tiny"], train_data="math_train", heldout_data="math_test", kl=[kl],
                                     betas=[beta], seeds=[seed], train=train,
                                     health={"collapse_window": 0, **(health or {})})}  # fmt: skip
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study=study, kl=[kl], betas=[beta], seeds=[seed], steps=[0, *snapshot_steps],
                                snapshot_dtype=snapshot_dtype)  # fmt: skip
    config["figures"], config["claims"] = {}, {}
    return cell_settings(validate_config(config), study, "tiny", kl, beta, seed)


def reduced_config() -> dict:
    """config.yaml with every stage kept but made small: few toy trials, a barely trained model, short cells of
    an on-policy and an off-policy study, evaluation of one configuration, one figure of each kind."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["toy"].update(trials=30, sequences=100, lengths=[2, 6])
    # The atlas with a setting of each kind its report draws and judges: a grid setting, a preset (and K1 in the
    # advantage in each), one β, a short length sweep, a few Monte Carlo seeds.
    config["toy"]["atlas"] = {
        "configs": ["k3-loss", "k1-advantage"], "normalisations": ["rloo", "group_std"], "group_sizes": [2, 4],
        "betas": [1.0], "presets": ["trl-1.16", "openrlhf-0.11-k1-advantage"],
        "length": {"settings": ["k3-loss/rloo/G2", "trl-1.16"], "max_length": {"parametric": 3, "tabular": 3}},
        "monte_carlo": {"settings": ["k3-loss/rloo/G4", "k3-loss/group_std/G2", "k1-advantage/group_std/G2",
                                     "trl-1.16"], "betas": [1.0], "seeds": 3},
    }  # fmt: skip
    config["models"]["tiny"]["spec"] = dict(hidden_size=64, num_heads=2, num_layers=1, sft_steps=10, sft_batch=8)
    del config["models"]["tiny"]["pinned"]  # built by the workflow, as a model with no pinned copy is
    config["studies"] = {name: config["studies"][name] for name in ("onpolicy", "offpolicy_k1_loss")}
    config["studies"]["onpolicy"].update(kl=["none", "k1-reward"], betas=[0.1], seeds=[0])
    config["studies"]["offpolicy_k1_loss"].update(betas=[0.1])
    for study in config["studies"].values():
        study["train"].update(steps=2, rollouts=2, max_response_tokens=8, eval_every=1, checkpoint_every=1)
        study["health"] = {"collapse_window": 0}  # two steps are too few to tell a collapse from noise: rule off
        study["train"].update(batch_prompts=4, minibatch_prompts=4 if study["train"]["minibatch_prompts"] == 8 else 2)
    config["evaluation"].update(tasks=["math500", "mmlu_college_biology"], k=2, max_tokens=8, limit=3,
                                studies={"onpolicy": ["none", "k1-reward"]})  # fmt: skip
    # Fig. 12 on the off-policy K1-in-loss cell: in two steps of this barely trained model every reward is 0, so
    # on-policy cells start with a zero gradient (their policy equals the reference); K1's pathwise term does not.
    config["divergence"].update(
        study="offpolicy_k1_loss", kl=["k1-loss"], betas=[0.1], seeds=[0], steps=[0, 1, 2], tasks=["math500"],
        prompts=3, samples=2, max_tokens=8,
    )  # fmt: skip
    onpolicy, offpolicy = dict(study="onpolicy", model="tiny"), dict(study="offpolicy_k1_loss", model="tiny")
    divergence = [
        dict(kind="divergence", metric=m, task="math500", kl=["k1-loss"], **offpolicy)
        for m in ("forward_kl", "entropy")
    ]
    config["figures"] = {
        "fig_curves": {
            "title": "curves",
            "panels": [dict(kind="curves", **onpolicy), dict(kind="curves", **offpolicy)],
        },
        "fig_bars": {"title": "bars", "panels": [dict(kind="bars", **onpolicy)]},
        "fig_divergence": {"title": "divergence", "panels": divergence},
    }
    config["claims"] = claims_it_can_test(config)  # RL against the base model, K1 in the reward against no KL, ...
    return config


@pytest.fixture(scope="session")
def reduced_run(tmp_path_factory):
    """The reduced study run through Snakemake in a scratch directory, then its report."""
    workdir = tmp_path_factory.mktemp("reduced_run")
    config = reduced_config()
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    snakemake("--cores", "2", "--configfile", str(workdir / "config.yaml"), cwd=workdir)
    snakemake("--cores", "2", "--configfile", str(workdir / "config.yaml"), "--report", "report.html", cwd=workdir)
    return workdir, config
