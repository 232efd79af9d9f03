"""Aggregation into tidy tables, every figure and table function, on small fixture results with gaps."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from klstudy import aggregate, figures, kl, tables
from klstudy.config import all_cells, run_path, validate_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def config():
    """config.yaml with two seeds in the on-policy grid (the spread over seeds is part of what is tested)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["studies"]["onpolicy"]["seeds"] = [0, 1]
    return validate_config(config)


def write_cell(results: Path, cell: dict, status: str, pass_at_1: list[float], steps_per_eval: int = 5) -> None:
    """A run's outputs as klstudy.cell writes them: metrics, held-out pass@1 and summary."""
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
    for name in config["figures"]:
        figures.paper_figure(name, config, read, tmp_path / "figures" / f"{name}.png")
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 0
        assert (tmp_path / "figures" / f"{name}.pdf").stat().st_size > 0


def test_curves_mark_runs_that_stopped_early(config, results, tmp_path):
    aggregate.write_tables(config, results, tmp_path / "tables")
    tables = aggregate.read_tables(tmp_path / "tables")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    figures.curves_panel(
        ax, {"kind": "curves", "study": "onpolicy", "model": "tiny", "kl": ["k3-reward"]}, config, tables
    )
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "K3 in reward, β = 1 (1/2 collapsed, 1/2 missing)" in labels
    assert "K3 in reward, β = 0.1 (2/2 missing) - no data" in labels
    assert any(c.get_offsets().shape[0] == 1 for c in ax.collections)  # the cross at its last point
    plt.close(fig)


def test_bars_use_the_spread_over_seeds(config, results, tmp_path):
    aggregate.write_tables(config, results, tmp_path / "tables")
    rows = aggregate.read_tables(tmp_path / "tables")["evaluations"]
    rows = rows[(rows.kl == "k1-reward") & (rows.beta == 0.1) & (rows.task == "math500") & (rows.study == "onpolicy")]
    spread = figures.seed_spread(rows, "mean_at_k", "stderr")
    assert spread["mean"] == pytest.approx(0.4) and spread["seeds"] == 2
    assert spread["error"] == pytest.approx(pd.Series([0.5, 0.3]).std())
    one = figures.seed_spread(rows.head(1), "mean_at_k", "stderr")
    assert one["error"] == pytest.approx(0.01)  # one seed: lm-eval's own standard error


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


def test_relative_improvement_by_hand():
    rows = [  # kl, task, seed, mean@k, lm-eval stderr
        ("k1-reward", "math500", 0, 0.6, 0.03), ("k1-reward", "math500", 1, 0.4, 0.04),
        ("k3-loss", "math500", 0, 0.4, 0.02), ("k3-loss", "math500", 1, 0.4, 0.02),
        ("k1-reward", "mmlu_college_biology", 0, 0.3, 0.1), ("k3-loss", "mmlu_college_biology", 0, 0.2, 0.1),
        ("k1-reward", "mmlu_college_physics", 0, 0.2, 0.1), ("k3-loss", "mmlu_college_physics", 0, 0.4, 0.1),
    ]  # fmt: skip
    evaluations = pd.DataFrame(
        [dict(study="onpolicy", model="m", kl=k, beta=0.05, task=t, seed=s, mean_at_k=v, stderr=e)
         for k, t, s, v, e in rows]
    )  # fmt: skip
    table = tables.relative_improvement(evaluations, in_domain=["math500"])
    ours = table[table.source == "this run"].set_index("domain")
    assert ours.loc["in-domain", "relative_improvement_pct"] == pytest.approx(25.0)  # (0.5 - 0.4) / 0.4
    assert ours.loc["out-of-domain", "relative_improvement_pct"] == pytest.approx((50.0 - 50.0) / 2)
    # seed by seed: +50 % and 0 %; one seed out of domain has no spread
    assert ours.loc["in-domain", "seed_std_pct"] == pytest.approx(50 / 2**0.5, abs=0.01)
    assert list(ours.seeds) == [2, 1] and pd.isna(ours.loc["out-of-domain", "seed_std_pct"])
    # lm-eval's stderr through c / b: seed-mean stderrs 0.025 and 0.02 / √2, c / b = 1.25
    in_domain = 100 / 0.4 * (0.025**2 + 1.25**2 * 0.02**2 / 2) ** 0.5
    out_of_domain = ((100 / 0.2) ** 2 * (0.01 + 1.5**2 * 0.01) + (100 / 0.4) ** 2 * (0.01 + 0.5**2 * 0.01)) ** 0.5 / 2
    assert ours.loc["in-domain", "lm_eval_stderr_pct"] == pytest.approx(in_domain, abs=0.01)
    assert ours.loc["out-of-domain", "lm_eval_stderr_pct"] == pytest.approx(out_of_domain, abs=0.01)
    paper = table[table.source != "this run"].set_index(["model", "domain"]).relative_improvement_pct
    assert paper[("Qwen2.5-7B", "out-of-domain")] == 19.06 and paper[("Llama-3.1-8B-Instruct", "in-domain")] == 15.94
    assert tables.relative_improvement(evaluations[evaluations.kl == "k3-loss"], ["math500"]).empty


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
    assert list(table.estimator) == ["K1", "K1", "K1", "K3", "K3", "K3"]
    assert list(table.config) == ["k1-reward", "k1-loss", "k1-loss-ratio", "k3-reward", "k3-loss", "k3-loss-ratio"]
    assert "use_bias_correction_kl=True" in table.set_index("config").framework["k3-loss-ratio"]
    assert list(table.exact_unbiased) == ["yes", "no", "no", "no", "no", "no"]
    assert list(table.expression) == ["-log r"] * 3 + ["r - 1 - log r"] * 3
    assert table.set_index("config").behaviour["k1-reward"].startswith("stable")
    assert table.set_index("config").behaviour["k3-loss"] == "not trained"


def test_aggregation_and_figure_jobs_do_not_import_torch():
    """Eleven figure jobs and the aggregation run per study, light and local on SLURM: importing torch would add
    about 1.5 s to each and put them on the two cores' critical path at the end of the run."""
    code = (
        "import sys, klstudy.cli, klstudy.aggregate, klstudy.figures;"
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
    table = tables.regularisation(training, cells, config, tests, ["onpolicy"]).set_index(["kl", "beta"])
    assert table.loc[("k1-reward", 1.0), "final_kl"] == pytest.approx(0.3)
    assert table.loc[("k1-reward", 1.0), "seed_std"] == pytest.approx(0.0707, abs=1e-4)
    assert table.loc[("k1-reward", 0.1), "no_kl_final_kl"] == pytest.approx(1.0)
    assert list(table.below_no_kl) == ["yes", "yes", "no", "no"]
    assert list(table.falls_as_beta_grows) == ["yes", "yes", "no", "no"]
    assert table.loc[("k1-reward", 0.1), "predicted"].startswith("pulls towards π_ref (the KL's own")
    assert table.loc[("k1-loss", 0.1), "predicted"].startswith("no pull")
    # paired by seed, the shared seed effect (±0.05 in every run of a seed) cancels: no spread left
    assert table.loc[("k1-reward", 1.0), "minus_no_kl"] == pytest.approx(-0.7)
    assert table.loc[("k1-loss", 1.0), "minus_no_kl"] == pytest.approx(0.5)
    assert table.minus_no_kl_std.abs().max() < 1e-9
    alone = training[(training.kl != "none") & (training.beta == 1.0)]  # no no-KL run, one β: nothing to compare
    table = tables.regularisation(alone, cells, config, tests, ["onpolicy"])
    assert set(table.below_no_kl) == {"n/a"} and set(table.falls_as_beta_grows) == {"n/a"}
    figures.paper_figure("fig13_regularisation", config, {"training": training, "cells": cells}, tmp_path / "fig13.png")
    assert (tmp_path / "fig13.png").stat().st_size > 10_000 and (tmp_path / "fig13.pdf").is_file()
