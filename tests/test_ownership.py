"""A run of other configs cannot overwrite the run a directory holds (src/klstudy/run/ownership.py): the workflow
records which config files made a run, refuses an overlay whose cells would land on that run's, naming the directory
and the way out, and `make study RUN_DIR=…` runs it in a directory of its own."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from klstudy.config import RUN_DIR, all_cells, validate_config
from klstudy.run import ownership

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = ROOT / ".venv" / "bin" / "snakemake"


def default_config() -> dict:
    return validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))


def test_the_same_configs_go_on_and_are_recorded(tmp_path):
    config = default_config()
    for _ in range(2):
        ownership.claim(config, [ROOT / "config.yaml"], ROOT, tmp_path)
    assert json.loads((tmp_path / ownership.RECORD).read_text()) == {"configs": ["config.yaml"]}


def test_other_configs_whose_cells_are_there_are_refused_naming_the_directory_and_the_way_out(tmp_path):
    config = default_config()
    ownership.claim(config, [ROOT / "config.yaml"], ROOT, tmp_path)
    cell = RUN_DIR.format(**all_cells(config)[0])
    (tmp_path / cell).mkdir(parents=True)
    overlay = [ROOT / "config.yaml", ROOT / "config" / "separation.yaml"]
    with pytest.raises(ownership.RunClash) as refused:
        ownership.claim(config, overlay, ROOT, tmp_path)
    message = str(refused.value)
    assert str(tmp_path.resolve()) in message and cell in message and "RUN_DIR=" in message
    assert "config.yaml + config/separation.yaml" in message
    assert json.loads((tmp_path / ownership.RECORD).read_text()) == {"configs": ["config.yaml"]}  # unchanged


def test_other_configs_whose_cells_are_all_new_there_go_on(tmp_path):
    config = default_config()
    ownership.claim(config, [ROOT / "config.yaml"], ROOT, tmp_path)
    (tmp_path / "results" / "runs" / "some_other_study").mkdir(parents=True)
    ownership.claim(config, [ROOT / "config" / "pilot.yaml"], ROOT, tmp_path)
    assert json.loads((tmp_path / ownership.RECORD).read_text()) == {"configs": ["config/pilot.yaml"]}


def run_snakemake(workdir: Path, *configs: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SNAKEMAKE, "results/data/math_test.jsonl", "--snakefile", ROOT / "Snakefile", "--directory", workdir,
         "--cores", "1", "--configfile", *[ROOT / c for c in configs]],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_workflow_refuses_an_overlay_on_the_default_run_before_any_job(tmp_path):
    if not SNAKEMAKE.exists():
        pytest.skip(".venv is not built (make venv builds it)")
    first = run_snakemake(tmp_path, "config.yaml")
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((tmp_path / ownership.RECORD).read_text()) == {"configs": ["config.yaml"]}
    (tmp_path / RUN_DIR.format(**all_cells(default_config())[0])).mkdir(parents=True)  # a cell of the default run
    (tmp_path / "results" / "data" / "math_test.jsonl").unlink()
    overlay = run_snakemake(tmp_path, "config.yaml", "config/separation.yaml")
    assert overlay.returncode != 0 and "would overwrite" in overlay.stderr, overlay.stderr[-3000:]
    assert not (tmp_path / "results" / "data" / "math_test.jsonl").exists()


def test_make_study_in_a_run_dir_runs_there_with_the_repositorys_files():
    dry = subprocess.run(
        ["make", "-n", "study", "RUN_DIR=runs/separation", "CONFIG=config.yaml config/separation.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    commands = [line for line in dry.stdout.replace("\\\n", " ").splitlines() if "snakemake" in line]
    assert len(commands) == 2
    for command in commands:
        assert command.startswith("mkdir -p runs/separation && cd runs/separation && ")
        assert f"--snakefile {ROOT}/Snakefile" in command
        assert f"--configfile {ROOT}/config.yaml {ROOT}/config/separation.yaml" in command
