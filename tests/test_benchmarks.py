"""The GPU benchmarks' own logic on a CPU (benchmarks/step_phases.py), the stand-ins' shapes, and the measured table
that docs/paper-scale.md prints from their files in docs/record/gpu/."""

import json
import re
import subprocess
import sys

import pytest
import torch
import yaml
from workflow_helpers import ROOT

from klstudy.config import validate_config
from klstudy.train import standins, tiny

RECORD = ROOT / "docs" / "record" / "gpu"
PHASES = ("generation", "scoring", "update")


def _phases(tmp_path, kl: str) -> dict:
    out = tmp_path / f"{kl}.json"
    command = [sys.executable, str(ROOT / "benchmarks/step_phases.py"), "--shape", "tiny", "--kl", kl, "--prompts", "4",
               "--steps", "2", "--response-tokens", "8", "--out", str(out)]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


# K1 in the reward's two passes are the ordinary path, `make test-all` (30-60 s, CI's time); TRL's one-pass shortcut
# is the one a change of TRL could break
@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
@pytest.mark.parametrize(("kl", "passes"), [pytest.param("k1-reward", 2, marks=pytest.mark.slow), ("k1-loss", 1)])
def test_step_phases_splits_each_step_and_counts_the_scoring_passes(tmp_path, kl, passes):
    """K1 in the reward needs the sampling policy's log-probs and the reference's (two passes over the batch); K1 in
    the loss on-policy only the reference's (TRL's shortcut). The phases add up to the step; one micro-batch of 10
    completions per update pass, 2 accumulation steps."""
    result = _phases(tmp_path, kl)
    assert result["settings"] | {"micro_batch": 10, "accumulation": 2} == result["settings"]
    assert len(result["steps"]) == 2 and result["steps_in_medians"] == 1  # the first step is left out
    step = result["steps"][1]
    assert step["sequences"] == 20 and step["update_sequences"] == 20 and step["scoring_sequences"] == 20 * passes
    assert result["tokens"]["scoring_passes"] == passes
    assert all(step[f"{phase}_s"] > 0 for phase in PHASES)
    assert result["seconds"]["step"] == pytest.approx(sum(result["seconds"][p] for p in PHASES), abs=0.02)


def test_the_qwen3_4b_stand_in_has_the_published_parameter_count():
    tokenizer = tiny.build_tokenizer(standins.SHAPES["qwen3-4b"]["vocab_size"])
    config = standins.config_of("qwen3-4b", tokenizer)
    with torch.device("meta"):
        model = standins.classes_of("qwen3-4b")[1](config)
    assert type(model).__name__ == "Qwen3ForCausalLM" and config.head_dim == 128
    assert sum(p.numel() for p in model.parameters()) == 4_022_468_096  # Qwen/Qwen3-4B-Instruct-2507's


def _table_rows() -> list[list[str]]:
    text = (ROOT / "docs/paper-scale.md").read_text()
    table = text.split("| stand-in | phase |", 1)[1].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def _tflops(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def test_the_measured_table_is_the_recorded_files():
    """Each row of docs/paper-scale.md's measured table, number for number, from the benchmark's JSON."""
    files = sorted(RECORD.glob("step-phases-*.json"), key=lambda path: json.loads(path.read_text())["parameters"])
    rows = iter(_table_rows())
    for path in files:
        result = json.loads(path.read_text())
        assert result["device"] == "NVIDIA H200" and result["steps_in_medians"] == 1
        rates = {"generation": result["tokens_per_s"]["generated"], "scoring": result["tokens_per_s"]["scored"],
                 "update": result["tokens_per_s"]["trained"]}  # fmt: skip
        for index, phase in enumerate(PHASES):
            row = next(rows)
            if index == 0:
                assert row[0].endswith(f"({result['parameters'] / 1e9:.2f} B)"), row
            assert row[1].startswith(phase)
            assert row[2:] == [f"{result['seconds'][phase]:.1f}", f"{rates[phase]:,.0f}",
                               _tflops(result["tflops"][phase]), f"{result['peak_gib'][phase]:.1f}"], row  # fmt: skip
    assert next(rows, None) is None


def test_the_throughputs_the_estimate_assumes_are_no_higher_than_measured():
    """cluster.gpu_tflops's defaults for scoring and the update round down the largest stand-in's measurement."""
    largest = max((json.loads(p.read_text()) for p in RECORD.glob("step-phases-*.json")), key=lambda r: r["parameters"])
    defaults = validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))["cluster"]["gpu_tflops"]
    for phase in ("scoring", "update"):
        assert 0.9 * largest["tflops"][phase] <= defaults[phase] <= largest["tflops"][phase]
    text = " ".join((ROOT / "docs/paper-scale.md").read_text().split())
    assert re.search(rf"defaults for scoring \({defaults['scoring']}\) and the update \({defaults['update']}\)", text)
