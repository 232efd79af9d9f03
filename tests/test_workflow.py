"""The Snakemake workflow: its DAG, a reduced end-to-end run of every stage, and the report."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
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


def job_counts(output: str) -> dict:
    table = output.split("Job stats:")[1].split("total")[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


@pytest.mark.parametrize("name", ["config.yaml", "config/paper.yaml"])
def test_dry_run_has_one_toy_job_per_setting(name, tmp_path):
    config = yaml.safe_load((ROOT / name).read_text())
    counts = job_counts(snakemake("-n", "--cores", "1", "--configfile", str(ROOT / name), cwd=tmp_path))
    assert counts["toy_bias_variance"] == len(config["toy"]["settings"])
    assert counts["toy_unbiasedness"] == counts["fig01"] == counts["table1"] == 1


def test_lint_is_clean():
    out = snakemake("--lint", "--cores", "1")
    assert "Lints for" not in out, out


def reduced_config() -> dict:
    """config.yaml with every stage kept but made small: few toy trials, a barely trained model, 2 short cells."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["toy"].update(trials=30, sequences=100, lengths=[2, 6])
    config["models"]["tiny"]["spec"] = dict(hidden_size=64, num_heads=2, num_layers=1, sft_steps=10, sft_batch=8)
    study = config["studies"]["onpolicy"]
    study.update(kl=["none", "k1-reward"], betas=[0.1], seeds=[0])
    study["train"].update(steps=2, batch_prompts=2, minibatch_prompts=2, rollouts=2, max_response_tokens=8,
                          eval_every=1, checkpoint_every=1)  # fmt: skip
    config["evaluation"].update(tasks=["math500", "mmlu_college_biology"], k=2, max_tokens=8, limit=3)
    return config


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """The reduced study run through Snakemake in a scratch directory, then its report."""
    workdir = tmp_path_factory.mktemp("reduced_run")
    config = reduced_config()
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    snakemake("--cores", "2", "--configfile", str(workdir / "config.yaml"), cwd=workdir)
    snakemake("--cores", "2", "--configfile", str(workdir / "config.yaml"), "--report", "report.html", cwd=workdir)
    return workdir, config


def test_end_to_end_outputs(toy_run):
    workdir, config = toy_run
    for name in ("fig01_toy_bias_variance.png", "fig01_toy_bias_variance.pdf", "table1.md", "table1.csv"):
        assert (workdir / "figures" / name).stat().st_size > 0, name
    table = pd.read_csv(workdir / "figures" / "table1.csv")
    assert len(table) == 9  # 3 estimators × reward/loss/both
    assert set(table.unbiased_gradient) <= {"yes", "no"}
    results = pd.read_csv(workdir / "results" / "toy" / "apart.csv")
    assert sorted(results["T"].unique()) == [2, 6]
    assert (results.trials == 30).all() and (results.sequences == 100).all()
    for setting in config["toy"]["settings"]:
        assert (workdir / "logs" / "toy" / f"{setting}.log").exists()
        assert (workdir / "results" / "benchmarks" / "toy" / f"{setting}.tsv").exists()


def test_every_cell_trained_and_recorded(toy_run):
    workdir, config = toy_run
    runs = sorted((workdir / "results" / "runs").glob("*/*/*/*/*/summary.json"))
    assert [str(p.relative_to(workdir / "results" / "runs").parent) for p in runs] == [
        "onpolicy/tiny/k1-reward/beta~0.1/seed~0",
        "onpolicy/tiny/none/beta~0/seed~0",
    ]
    for summary_path in runs:
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "ok" and summary["steps_done"] == 2
        cell = summary_path.parent
        assert [row["step"] for row in map(json.loads, (cell / "metrics.jsonl").read_text().splitlines())] == [1, 2]
        assert [row["step"] for row in map(json.loads, (cell / "heldout.jsonl").read_text().splitlines())] == [0, 1, 2]
        assert (cell / "final" / "model.safetensors").is_file()
    for name in config["data"]:
        assert (workdir / "results" / "data" / f"{name}.jsonl").stat().st_size > 0
    assert (workdir / "results" / "models" / "tiny" / "klstudy_build.json").is_file()


def test_every_cell_and_base_model_evaluated(toy_run):
    workdir, _ = toy_run
    evals = sorted(
        str(p.relative_to(workdir / "results" / "evals")) for p in (workdir / "results" / "evals").rglob("*.json")
    )
    assert evals == [
        "base/tiny/template~off/math500.json",
        "base/tiny/template~off/mmlu_college_biology.json",
        "base/tiny/template~on/math500.json",
        "base/tiny/template~on/mmlu_college_biology.json",
        "onpolicy/tiny/k1-reward/beta~0.1/seed~0/math500.json",
        "onpolicy/tiny/k1-reward/beta~0.1/seed~0/mmlu_college_biology.json",
        "onpolicy/tiny/none/beta~0/seed~0/math500.json",
        "onpolicy/tiny/none/beta~0/seed~0/mmlu_college_biology.json",
    ]
    row = json.loads((workdir / "results/evals/onpolicy/tiny/none/beta~0/seed~0/math500.json").read_text())
    assert row["k"] == 2 and row["cell_status"] == "ok" and 0 <= row["mean_at_k"] <= 1
    samples = (workdir / "results/evals/onpolicy/tiny/none/beta~0/seed~0/math500.samples.jsonl").read_text()
    assert len(samples.splitlines()) == 3


def test_report_contains_figure_table_captions_and_config(toy_run):
    workdir, _ = toy_run
    html = (workdir / "report.html").read_text()
    assert "fig01_toy_bias_variance.png" in html and "table1.csv" in html
    assert "Figure 1" in html and "Table 1" in html
    assert "embedded" in html
