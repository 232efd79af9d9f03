"""Aggregation into tidy tables, every figure and table function, on small fixture results with gaps."""

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import yaml

from klstudy import kl
from klstudy.config import all_cells, run_path, validate_config
from klstudy.report import aggregate, tables
from klstudy.report import tables as tables_module
from klstudy.report.figures import encoding, forest
from klstudy.report.figures import paper as paper_figures
from klstudy.report.figures import training as training_figures

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def config():
    """config.yaml with two seeds in the on-policy grid (the spread over seeds is part of what is tested)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["studies"]["onpolicy"]["seeds"] = [0, 1]
    return validate_config(config)


def write_cell(results: Path, cell: dict, status: str, pass_at_1: list[float], steps_per_eval: int = 5) -> None:
    """A run's outputs as klstudy.train.cell writes them: metrics, held-out pass@1 and summary."""
    directory = results / "runs" / run_path(cell)
    directory.mkdir(parents=True)
    heldout = [{"step": i * steps_per_eval, "pass_at_1": p, "stderr": 0.05} for i, p in enumerate(pass_at_1)]
    metrics = [{"step": s, "task_reward": 0.3, "kl_k1": 0.1, "kl_k3": 0.1, "loss": 0.0} for s in range(1, 3)]
    for name, rows in (("heldout.jsonl", heldout), ("metrics.jsonl", metrics)):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": status, "reason": "", "steps_done": 2, "base_model_sha256": "ab" * 32}
    (directory / "summary.json").write_text(json.dumps(summary))


def write_eval(results: Path, relative: str, score: float, status: str = "ok", unread: float = 0.25) -> None:
    path = results / "evals" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mean_at_k": score, "stderr": 0.01, "unread": unread, "k": 4, "cell_status": status}))


def cell(config, **keys) -> dict:
    return next(c for c in all_cells(config) if all(str(c[k]) == str(v) for k, v in keys.items()))


@pytest.fixture
def results(tmp_path, config):
    """Three on-policy runs (one collapsed), evaluations of two seeds of one configuration and of the base model."""
    results = tmp_path / "results"
    write_cell(results, cell(config, study="onpolicy", kl="k1-reward", beta=0.1, seed=0), "ok", [0.3, 0.4, 0.5])
    write_cell(results, cell(config, study="onpolicy", kl="k1-reward", beta=0.1, seed=1), "ok", [0.3, 0.5, 0.45])
    write_cell(results, cell(config, study="onpolicy", kl="k3-reward", beta=1.0, seed=0), "collapsed", [0.3, 0.0])
    for seed, score, unread in ((0, 0.5, 0.25), (1, 0.3, 0.75)):
        write_eval(results, f"onpolicy/tiny/k1-reward/beta~0.1/seed~{seed}/math500.json", score, unread=unread)
    write_eval(results, "base/tiny/template~on/math500.json", 0.2, "base")
    return results


def test_every_grid_cell_is_a_row_and_missing_ones_say_so(config, results):
    cells = aggregate.cells_table(config, results)
    assert len(cells) == len(all_cells(config)) == 36
    statuses = cells.set_index(["study", "kl", "beta", "seed"]).status
    assert statuses[("onpolicy", "k1-reward", 0.1, 0)] == "ok"
    assert statuses[("onpolicy", "k3-reward", 1.0, 0)] == "collapsed"
    assert (cells.status == "missing").sum() == 33
    assert set(cells[cells.kl == "none"].beta) == {0.0}
    assert {"estimator", "placement"} <= set(cells.columns)
    recorded = cells.set_index(["study", "kl", "beta", "seed"]).base_model_sha256
    assert recorded[("onpolicy", "k1-reward", 0.1, 0)] == "ab" * 32  # the base model each run started from
    assert cells[cells.status == "missing"].base_model_sha256.isna().all()


def test_evaluations_table_has_a_row_per_cell_task_and_base_model(config, results):
    table = aggregate.evaluations_table(config, results)
    tasks = config["evaluation"]["tasks"]
    evaluated = 8 + 2 + 4  # onpolicy k1-reward/k3-loss × 2 β × 2 seeds, async_math 2, unbiased 4
    assert len(table) == (evaluated + 2) * len(tasks)  # + the base model with and without its template
    scored = table.dropna(subset=["mean_at_k"])
    assert sorted(scored.mean_at_k) == [0.2, 0.3, 0.5]
    assert sorted(scored.unread) == [0.25, 0.25, 0.75]
    assert (table[table.mean_at_k.isna()].cell_status == "missing").all()
    summary = tables.evaluation_summary(table).set_index(["study", "task"]).unread  # the mean over seeds
    assert summary[("onpolicy", "math500")] == 0.5 and summary[("base", "math500")] == 0.25


def test_write_tables_and_every_configured_figure_draws_with_gaps(config, results, tmp_path):
    tables = aggregate.write_tables(config, results, tmp_path / "tables")
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        "cells.csv", "divergence.csv", "evaluations.csv", "heldout.csv", "training.csv",
    ]  # fmt: skip
    assert len(tables["heldout"]) == 8 and len(tables["training"]) == 6 and tables["divergence"].empty
    read = aggregate.read_tables(tmp_path / "tables")
    out = tmp_path / "figures"
    toy = pd.DataFrame([{"config": "k1-reward", "estimator": "k1", "expression": "-log r", "placement": "reward",
                         "loss_gradient": "pathwise", "framework": "", "unbiased": True, "exact_unbiased": True,
                         "max_abs_exact_bias": 0.0, "max_abs_exact_bias_T1": 0.0, "max_abs_z": 1.0, "z_critical": 3.0,
                         "worst_case": "", "alpha": 0.01}])  # fmt: skip
    toy.to_csv(tmp_path / "toy.csv", index=False)
    tables_module.write_study_tables(config, read, tmp_path / "toy.csv", out)
    claims = encoding.read_claims(out / "claims.csv")  # the verdicts the figures print, as the workflow passes them
    for name in config["figures"]:  # drawn in memory (writing each costs a second or two); two written below
        fig, caption = paper_figures.draw_paper_figure(name, config, read, claims)
        plt.close(fig)
        assert caption, name
    for study in config["studies"]:
        fig, caption = training_figures.draw_training_figure(study, config, read)
        plt.close(fig)
        assert caption, study
    paper_figures.paper_figure("fig02_k1_in_loss", config, read, out / "fig02_k1_in_loss.png", claims)
    forest.claims_forest(claims, config, out / "claims_forest_heldout.png", "heldout")
    for name in ("fig02_k1_in_loss", "claims_forest_heldout"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").stat().st_size > 0, name


def heldout_rows(kl_config, seed, values):
    return [dict(study="onpolicy", model="tiny", kl=kl_config, beta=0.1, seed=seed, step=5 * i, pass_at_1=v)
            for i, v in enumerate(values)]  # fmt: skip


def test_behaviour_rules():
    cells = pd.DataFrame(
        [dict(study="onpolicy", model="tiny", kl=k, beta=0.1, seed=s, status=st)
         for k, s, st in [("k1-reward", 0, "ok"), ("k1-reward", 1, "ok"), ("k3-reward", 0, "collapsed"),
                          ("k1-loss", 0, "ok"), ("k3-loss", 0, "diverged"), ("k2-loss", 0, "missing"),
                          ("none", 0, "ok")]]
    )  # fmt: skip
    heldout = pd.DataFrame(
        heldout_rows("k1-reward", 0, [0.3, 0.35, 0.4])
        + heldout_rows("k1-reward", 1, [0.3, 0.4, 0.3])  # a dip of 0.10 < 0.15: still stable
        + heldout_rows("k1-loss", 0, [0.3, 0.5, 0.3])  # a fall of 0.20 from its best: unstable
    )
    verdicts = tables.behaviour(cells, heldout, ["onpolicy"])
    assert verdicts["k1-reward"].startswith("stable (0 collapsed, 0 unstable of 2 runs)")
    assert verdicts["k1-loss"].startswith("instabilities (0 collapsed, 1 unstable of 1 runs)")
    assert verdicts["k3-reward"].startswith("collapse")
    assert verdicts["k3-loss"].startswith("instabilities")
    assert verdicts["k2-loss"] == "not trained" and "none" not in verdicts
    assert tables.behaviour(cells, heldout, ["other"]) == {}


def test_onpolicy_studies_are_those_with_one_update_and_no_asynchrony(config):
    assert tables.onpolicy_studies(config) == ["onpolicy", "unbiased"]


def test_evaluation_differences_by_hand(config):
    """K1 in the reward − K3 in the loss in points, paired by seed, and each against the base model's one
    evaluation (whose error is added once, not averaged away over seeds)."""
    rows = [  # kl, task, seed, mean@k, lm-eval stderr
        ("k1-reward", "math500", 0, 0.6, 0.03), ("k1-reward", "math500", 1, 0.4, 0.04),
        ("k3-loss", "math500", 0, 0.4, 0.02), ("k3-loss", "math500", 1, 0.4, 0.02),
    ]  # fmt: skip
    evaluations = pd.DataFrame(
        [dict(study="onpolicy", model="tiny", kl=k, beta=0.1, task=t, seed=s, mean_at_k=v, stderr=e)
         for k, t, s, v, e in rows]
        + [dict(study="base", model="tiny", kl="base", beta=0.0, task="math500", seed=0, mean_at_k=0.3, stderr=0.05)]
    )  # fmt: skip
    config = {**config, "evaluation": {**config["evaluation"], "tasks": ["math500"], "in_domain": ["math500"]}}
    table = tables.evaluation_differences(evaluations, config).set_index(["candidate", "baseline"])
    paper = table.loc[("k1-reward", "k3-loss")]
    assert paper.difference_pts == pytest.approx(10.0) and paper.seeds == 2  # (0.2 + 0.0) / 2
    assert paper.se_pts == pytest.approx(10.0)  # the seeds' spread, 0.1414 / √2, above the questions' 0.025
    assert paper.critical == pytest.approx(31.82, abs=0.01)  # the claims rule: max(3, t(0.99, 1 df))
    assert paper.low_pts == pytest.approx(10 - 318.2, abs=0.1)
    base = table.loc[("k1-reward", "base")]
    assert base.difference_pts == pytest.approx(20.0)
    assert base.se_pts == pytest.approx(100 * (0.1**2 + 0.05**2) ** 0.5)
    sections = tables.differences_sections(table.reset_index())
    assert "± 10" in sections[0][1]["difference (points)"].iloc[0]


def test_relative_improvements_as_section_4_1_computes_them(config):
    """§4.1's "average relative improvement": per task (K1 in the reward − K3 in the loss) / K3 in the loss of the
    means over seeds, averaged over the domain's tasks (not the ratio of the domain's means); against the base model
    its one evaluation with the chat template, never the one without (a separate experiment)."""
    rows = [  # kl, task, seed, mean@k
        ("k1-reward", "math500", 0, 0.6), ("k1-reward", "math500", 1, 0.4), ("k3-loss", "math500", 0, 0.4),
        ("k3-loss", "math500", 1, 0.4), ("k1-reward", "math_squared", 0, 0.1), ("k1-reward", "math_squared", 1, 0.1),
        ("k3-loss", "math_squared", 0, 0.05), ("k3-loss", "math_squared", 1, 0.05),
    ]  # fmt: skip
    evaluations = pd.DataFrame(
        [dict(study="onpolicy", model="tiny", kl=k, beta=0.1, task=t, seed=s, mean_at_k=v, stderr=0.01,
              chat_template="on") for k, t, s, v in rows]
        + [dict(study="base", model="tiny", kl="base", beta=0.0, task=t, seed=0, mean_at_k=v, stderr=0.01,
                chat_template=template)
           for template, v in (("on", 0.2), ("off", 0.02)) for t in ("math500", "math_squared")]
    )  # fmt: skip
    tasks = ["math500", "math_squared"]
    config = {**config, "evaluation": {**config["evaluation"], "tasks": tasks, "in_domain": tasks}}
    table = tables.evaluation_differences(evaluations, config).set_index(["candidate", "baseline"])
    paper = table.loc[("k1-reward", "k3-loss")]
    assert paper.relative_pct == pytest.approx(100 * (0.25 + 1.0) / 2)  # math500 +25 %, MATH² +100 %: 62.5 %, not 40 %
    base = table.loc[("k1-reward", "base")]
    assert base.baseline_mean == pytest.approx(0.2)  # with the template: 0.2; averaged with the one without: 0.11
    assert base.relative_pct == pytest.approx(100 * (1.5 - 0.5) / 2)  # math500 (0.5−0.2)/0.2, MATH² (0.1−0.2)/0.2
    section = tables.differences_sections(table.reset_index())[0][1]
    assert "+62.50 %" in list(section["relative (§4.1)"])


def test_numbers_to_three_significant_figures():
    assert [tables.sig(v) for v in (8772.1, 0.04567, 3.6e-15, 2.0, 0.0, float("nan"))] == [
        "8770", "0.0457", "3.6e-15", "2.00", "0", "",
    ]  # fmt: skip
    assert (
        tables.plus_minus(0.3083, 0.0118) == "0.308 ± 0.012" and tables.plus_minus(0.5, float("nan")) == "0.50 (no se)"
    )


def test_table1_gets_the_behaviour_column(tmp_path):
    tests = pd.DataFrame(  # in the toy's order: placement-major, as toy.unbiasedness_tests writes it
        [dict(config=f"{e}-{p}{'-' + g if g != 'pathwise' else ''}", estimator=e, expression=kl.EXPRESSIONS[e],
              placement=p, loss_gradient=g, framework=kl.LOSS_GRADIENT_SOURCES[g] if p != "reward" else "",
              unbiased=(e, p) == ("k1", "reward"), exact_unbiased=(e, p) == ("k1", "reward"), max_abs_exact_bias=0.5,
              max_abs_exact_bias_T1=0.0, max_abs_z=1.0, z_critical=3.5, worst_case="", alpha=0.01)
         for p, g in (("reward", "pathwise"), ("loss", "pathwise"), ("none", "pathwise"), ("loss", "ratio"))
         for e in ("k3", "k1")]
    )  # fmt: skip
    table = tables.table1(tests, {"k1-reward": "stable (0 collapsed, 0 unstable of 3 runs)"})
    # the paper's four rows first, in its order; then the frameworks' variants, by estimator
    assert list(table.config) == ["k1-reward", "k1-loss", "k3-reward", "k3-loss", "k1-loss-ratio", "k3-loss-ratio"]
    assert "use_bias_correction_kl=True" in table.set_index("config").framework["k3-loss-ratio"]
    assert list(table.exact_unbiased) == ["yes", "no", "no", "no", "no", "no"]
    assert list(table.expression) == ["-log r", "-log r", "r - 1 - log r", "r - 1 - log r", "-log r", "r - 1 - log r"]
    assert table.set_index("config").behaviour["k1-reward"].startswith("stable")
    assert table.set_index("config").behaviour["k3-loss"] == "not trained"
    sections = tables.table1_sections(table)
    assert [list(part.config) for _, part in sections] == [
        ["k1-reward", "k1-loss", "k3-reward", "k3-loss"], [], ["k1-loss-ratio", "k3-loss-ratio"],
    ]  # fmt: skip
    assert "loss gradient: framework" in sections[2][1] and "loss gradient: framework" not in sections[0][1]


def test_aggregation_and_figure_jobs_do_not_import_torch():
    """Eleven figure jobs and the aggregation run per study, light and local on SLURM: importing torch would add
    about 1.5 s to each and put them on the two cores' critical path at the end of the run."""
    code = (
        "import sys, klstudy.run.cli, klstudy.report.aggregate, klstudy.report.tables, klstudy.report.figures.paper,"
        "klstudy.report.figures.training, klstudy.report.figures.forest, klstudy.report.figures.toy,"
        "klstudy.report.figures.atlas;"
        "print([m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_study_tables_are_the_ones_the_workflow_names(tmp_path):
    """tables.study_tables builds exactly config.STUDY_TABLES (the rule's outputs and report entries)."""
    from klstudy.config import STUDY_TABLES

    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    aggregated = aggregate.write_tables(config, tmp_path / "results", tmp_path / "tables")  # nothing run yet
    toy = pd.DataFrame([{"config": "k1-reward", "estimator": "k1", "expression": "-log r", "placement": "reward",
                         "loss_gradient": "pathwise", "framework": "", "unbiased": True, "exact_unbiased": True,
                         "max_abs_exact_bias": 0.0, "max_abs_exact_bias_T1": 0.0, "max_abs_z": 1.0, "z_critical": 3.0,
                         "worst_case": "", "alpha": 0.01}])  # fmt: skip
    assert tuple(tables.study_tables(config, aggregated, toy)) == STUDY_TABLES


def _synthetic_onpolicy_run():
    """An on-policy study's logged KL: no KL ends at 1.0; K1 in the reward ends lower at larger β, K1 in the loss
    higher; two seeds each, the last final_steps = 3 steps constant, earlier steps far off (so that a wrong window
    shows)."""
    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    config["studies"]["onpolicy"].update(kl=["none", "k1-reward", "k1-loss"], betas=[0.1, 1.0], seeds=[0, 1])
    config["studies"]["onpolicy"]["final_steps"] = 3
    ends = {("none", 0.0): 1.0, ("k1-reward", 0.1): 0.6, ("k1-reward", 1.0): 0.3, ("k1-loss", 0.1): 1.1,
            ("k1-loss", 1.0): 1.5}  # fmt: skip
    rows, cells = [], []
    for (kl_config, beta), end in ends.items():
        for seed in (0, 1):
            identity = dict(study="onpolicy", model="tiny", kl=kl_config, estimator=kl_config.split("-")[0],
                            placement=(kl_config.split("-") + ["none"])[1], beta=beta, seed=seed)  # fmt: skip
            cells.append({**identity, "status": "ok"})
            for step in range(1, 7):
                value = 9.0 if step <= 3 else end + (0.05 if seed else -0.05)
                rows.append({**identity, "step": step, "kl_k3": value})
    return config, pd.DataFrame(rows), pd.DataFrame(cells)


def test_the_kl_at_the_end_is_the_mean_of_the_last_final_steps():
    config, training, _ = _synthetic_onpolicy_run()
    final = aggregate.final_values(training, config).set_index(["kl", "beta", "seed"]).kl_k3
    assert final[("k1-reward", 1.0, 0)] == pytest.approx(0.25) and final[("none", 0.0, 1)] == pytest.approx(1.05)


def test_the_regularisation_table_compares_each_beta_with_no_kl_and_states_the_prediction(tmp_path):
    config, training, cells = _synthetic_onpolicy_run()
    tests = pd.DataFrame(
        [dict(config="k1-reward", exact_unbiased=True, min_projection=1.0, max_projection=1.0),
         dict(config="k1-loss", exact_unbiased=False, min_projection=0.0, max_projection=0.0)]
    )  # fmt: skip
    claims = pd.DataFrame(  # the claims table's verdicts, whatever the means say
        [dict(claim="k1_reward_regularises", study="onpolicy", model="tiny", metric="final_kl", candidate="k1-reward",
              baseline="none", beta=b, verdict="not shown", note="") for b in (0.1, 1.0)]
        + [dict(claim="k1_reward_falls_with_beta", study="onpolicy", model="tiny", metric="final_kl",
                candidate="k1-reward", baseline="k1-reward", beta=1.0, verdict="contradicted", note="")]
    )  # fmt: skip
    table = tables.regularisation(training, cells, config, tests, ["onpolicy"], claims).set_index(["kl", "beta"])
    assert table.loc[("k1-reward", 1.0), "final_kl"] == pytest.approx(0.3)
    assert table.loc[("k1-reward", 1.0), "final_kl_se"] == pytest.approx(0.05)  # the seeds' spread: 0.0707 / √2
    assert table.loc[("k1-reward", 0.1), "no_kl_final_kl"] == pytest.approx(1.0)
    # the means fall with β and lie below no KL; the columns say what the claims table says, nothing else
    assert list(table.claim_below_no_kl) == ["not shown (k1_reward_regularises)"] * 2 + ["no claim"] * 2
    assert table.loc[("k1-reward", 1.0), "claim_lower_at_larger_beta"] == "contradicted (k1_reward_falls_with_beta)"
    assert table.loc[("k1-reward", 0.1), "claim_lower_at_larger_beta"] == "no claim"
    assert table.loc[("k1-reward", 0.1), "predicted"].startswith("pulls towards π_ref (the KL's own")
    assert table.loc[("k1-loss", 0.1), "predicted"].startswith("no pull")
    # paired by seed, the shared seed effect (±0.05 in every run of a seed) cancels: no spread left
    assert table.loc[("k1-reward", 1.0), "minus_no_kl"] == pytest.approx(-0.7)
    assert table.loc[("k1-loss", 1.0), "minus_no_kl"] == pytest.approx(0.5)
    assert table.minus_no_kl_se.abs().max() < 1e-9 and set(table.paired_seeds) == {2}
    alone = training[(training.kl != "none") & (training.beta == 1.0)]  # no no-KL run: nothing to pair with
    table = tables.regularisation(alone, cells, config, tests, ["onpolicy"])
    assert table.minus_no_kl.isna().all() and set(table.claim_below_no_kl) == {"no claim"}
    compact = tables.regularisation_sections(table)[0][1]
    assert "claims table: against no KL" in compact and "below_no_kl" not in compact


def test_the_short_claims_table_takes_every_number_and_verdict_from_the_claims_table():
    claims = pd.DataFrame(
        [dict(claim="a", beta=1.0, baseline_beta=0.1, candidate="k1-reward", baseline="k1-reward", predicted="lower",
              effect=-0.2, se=0.1, z=2.0, critical=31.82, units=2, verdict="not shown", note=""),
         dict(claim="b", beta=0.1, baseline_beta="", candidate="k1-both", baseline="k3-loss", predicted="higher",
              effect=0.02, se=float("nan"), z=float("nan"), critical=float("nan"), units=1,
              verdict="not testable: one seed", note="")]
    )  # fmt: skip
    short = tables.claims_summary(claims).set_index("claim")
    assert list(short.verdict) == ["not shown", "not testable: one seed"]
    assert short.loc["a", "β"] == "1 vs 0.1" and short.loc["b", "β"] == "0.1"
    assert short.loc["a", "effect ± se"] == "-0.20 ± 0.10"
    assert short.loc["a", "effect ± critical·se"] == "[-3.4, 3.0]" and short.loc["a", "z / critical"] == "2.0 / 31.8"
    assert short.loc["b", "effect ± critical·se"] == "" and short.loc["b", "effect ± se"] == "0.020 (no se)"
