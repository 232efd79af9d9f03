"""Which figures a run draws, from its config alone: a claims forest per metric with a claim testable by design, each
study's training figure where there is something to read it against. Shared by the workflow's rules
(workflow/rules/common.smk), the figures (report/figures) and their redraw."""

from __future__ import annotations

CLAIMS_FIGURE = "claims_forest"  # figures/claims_forest_<metric>.png: every testable claim's effect ± critical·se


def claim_seeds(config: dict, claim: dict) -> set:
    """The training seeds a claim pairs by design: its study's, those of its baseline's study too, and for a metric
    of Fig. 12's snapshots only the divergence section's seeds."""
    seeds = set(config["studies"][claim["study"]]["seeds"])
    if claim["baseline"] != "base":
        seeds &= set(config["studies"][claim.get("baseline_study", claim["study"])]["seeds"])
    if claim["metric"] in ("forward_kl", "entropy"):
        seeds &= set(config["divergence"]["seeds"])
    return seeds


def testable_by_design(config: dict, claim: dict) -> bool:
    """Whether a claim can be tested at all: the rule judges the spread between seeds, so it needs two paired seeds
    (one seed: "not testable", whatever the data)."""
    return len(claim_seeds(config, claim)) >= 2


def claims_figures(config: dict) -> list[str]:
    """One claims forest per metric with a claim testable by design, in the config's order: figures/<name>, without
    extension (a forest of every metric at once is too long for a page; one of untestable claims draws nothing)."""
    metrics = [c["metric"] for c in config.get("claims", {}).values() if testable_by_design(config, c)]
    return [f"figures/{CLAIMS_FIGURE}_{metric}" for metric in dict.fromkeys(metrics)]


def lag_only(train: dict) -> bool:
    """Whether every batch of an asynchronous run was sampled by the initial policy (steps ≤ async_level + 1): its
    KL is 0 and its reward the reference's by construction."""
    return bool(train.get("async_level", 0)) and train["steps"] <= train["async_level"] + 1


def training_reference(config: dict, study: str) -> str | None:
    """What a study's training figure is read against: no KL where the study runs it, else the configuration its
    claims take as their baseline within the study (None: nothing to read it against)."""
    spec = config["studies"][study]
    if "none" in spec["kl"]:
        return "none"
    within = [
        c for c in config.get("claims", {}).values() if c["study"] == c.get("baseline_study", c["study"]) == study
    ]
    baselines = [c["baseline"] for c in within if c["baseline"] in spec["kl"]]
    return baselines[0] if baselines else None


def training_figures(config: dict) -> list[str]:
    """Each study's training dynamics (reward, KL, gradient norm): figures/training_<study>, without extension; none
    for a study whose every batch was sampled by the initial policy (lag_only: nothing to draw but constants) or
    that has nothing to be read against (training_reference); figures/README.md names them."""
    return [f"figures/training_{study}" for study, spec in config["studies"].items()
            if not lag_only(spec["train"]) and training_reference(config, study)]  # fmt: skip


# A comparison shows something only where the rule's interval can be narrower than the metric: with two paired seeds
# the critical value is Student's t at 1 − 0.01 with one degree of freedom, 31.8, and effect ± 31.8·se spans any
# metric's range; three seeds give 7.0, four 4.5.
SEEDS_TO_SHOW = 3
# A panel kind's metric in the claims table (divergence panels: the panel's own metric).
PANEL_METRICS = {"curves": "heldout", "bars": "evaluation", "kl_vs_beta": "final_kl", "kl_curves": "final_kl"}


def shows_something(config: dict, claim: dict) -> bool:
    """Whether a claim's comparison can be told from noise at the run's scale (SEEDS_TO_SHOW paired seeds)."""
    return len(claim_seeds(config, claim)) >= SEEDS_TO_SHOW


def panel_claims(config: dict, panel: dict) -> list[str]:
    """The config's claims about what a panel draws: its study and metric, a candidate it draws."""
    metric = panel.get("metric") if panel["kind"] == "divergence" else PANEL_METRICS.get(panel["kind"])
    kls = panel.get("kl", config["studies"][panel["study"]]["kl"])
    return [name for name, c in config.get("claims", {}).items()
            if c["study"] == panel["study"] and c["metric"] == metric and c["candidate"] in kls]  # fmt: skip


def figure_claims(config: dict, name: str) -> list[str]:
    """The claims a figure of the run draws: its panels' (a paper figure), its study's (training_<study>), its
    metric's (claims_forest_<metric>)."""
    claims = config.get("claims", {})
    if name in config.get("figures", {}):
        return list(dict.fromkeys(c for p in config["figures"][name]["panels"] for c in panel_claims(config, p)))
    if name.startswith("training_"):
        return [c for c, spec in claims.items() if spec["study"] == name.removeprefix("training_")]
    if name.startswith(f"{CLAIMS_FIGURE}_"):
        return [c for c, spec in claims.items() if spec["metric"] == name.removeprefix(f"{CLAIMS_FIGURE}_")]
    return []


def is_result(config: dict, name: str) -> bool:
    """Whether a figure of a run's results has a comparison that can show something at its scale; the others check
    the pipeline, and their captions say so first."""
    return any(shows_something(config, config["claims"][c]) for c in figure_claims(config, name))
