"""A run of other configs cannot overwrite the run a directory holds (src/klstudy/run/ownership.py): the workflow
records which config files made a run, refuses an overlay whose cells would land on that run's, naming the directory
and the way out, and `make study RUN_DIR=…` runs it in a directory of its own."""

import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from klstudy.config import RUN_DIR, all_cells, validate_config
from klstudy.run import ownership

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = ROOT / ".venv" / "bin" / "snakemake"


def default_config() -> dict:
    return validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))


def overlay_config() -> dict:
    from snakemake.utils import update_config  # how Snakemake merges an overlay

    merged = yaml.safe_load((ROOT / "config.yaml").read_text())
    update_config(merged, yaml.safe_load((ROOT / "config" / "separation.yaml").read_text()))
    return validate_config(merged)


def test_the_same_configs_go_on_and_are_recorded(tmp_path):
    config = default_config()
    for _ in range(2):
        ownership.claim(config, [ROOT / "config.yaml"], ROOT, tmp_path)
    record = json.loads((tmp_path / ownership.RECORD).read_text())
    assert record["configs"] == ["config.yaml"] and len(record["cells"]) == len(all_cells(config))


def test_other_configs_whose_cells_are_there_are_refused_naming_the_directory_and_the_way_out(tmp_path):
    config = default_config()
    ownership.claim(config, [ROOT / "config.yaml"], ROOT, tmp_path)
    cell = RUN_DIR.format(**all_cells(config)[0])
    (tmp_path / cell).mkdir(parents=True)
    overlay = [ROOT / "config.yaml", ROOT / "config" / "separation.yaml"]
    with pytest.raises(ownership.RunClash) as refused:
        ownership.claim(overlay_config(), overlay, ROOT, tmp_path)
    message = str(refused.value)
    assert str(tmp_path.resolve()) in message and cell in message and "RUN_DIR=" in message
    assert "config.yaml + config/separation.yaml" in message
    assert json.loads((tmp_path / ownership.RECORD).read_text())["configs"] == ["config.yaml"]  # unchanged


def test_the_cells_an_overlay_changes_are_the_ones_refused(tmp_path):
    """separation.yaml retrains the on-policy cells at the default's paths with other settings; a cell both configs
    train alike (another study's) is no clash."""
    default, overlay = default_config(), overlay_config()
    ownership.claim(default, [ROOT / "config.yaml"], ROOT, tmp_path)
    before, after = ownership.cell_digests(default), ownership.cell_digests(overlay)
    alike = [path for path in before if after.get(path) == before[path]]
    changed = [path for path in before if path in after and after[path] != before[path]]
    assert alike and changed and all("/onpolicy/" in path for path in changed)
    (tmp_path / alike[0]).mkdir(parents=True)
    ownership.claim(overlay, [ROOT / "config.yaml", ROOT / "config" / "separation.yaml"], ROOT, tmp_path)
    (tmp_path / changed[0]).mkdir(parents=True)
    ownership.claim(overlay, [ROOT / "config.yaml", ROOT / "config" / "separation.yaml"], ROOT, tmp_path)  # its own
    with pytest.raises(ownership.RunClash, match=r"run of config.yaml \+ config/separation.yaml \(results"):
        ownership.claim(default, [ROOT / "config.yaml"], ROOT, tmp_path)  # the default back over the overlay's


def test_other_configs_that_only_add_cells_go_on(tmp_path):
    config = default_config()
    ownership.claim(config, [ROOT / "config.yaml"], ROOT, tmp_path)
    for path in ownership.cell_digests(config):
        (tmp_path / path).mkdir(parents=True)
    more = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    more["studies"]["onpolicy"]["seeds"] = [0, 1, 2]
    ownership.claim(validate_config(more), [ROOT / "config.yaml", tmp_path / "three-seeds.yaml"], ROOT, tmp_path)
    record = json.loads((tmp_path / ownership.RECORD).read_text())
    assert record["configs"] == ["config.yaml", str((tmp_path / "three-seeds.yaml").resolve())]


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
    assert json.loads((tmp_path / ownership.RECORD).read_text())["configs"] == ["config.yaml"]
    changed = [p for p in ownership.cell_digests(default_config()) if "/onpolicy/" in p][0]
    (tmp_path / changed).mkdir(parents=True)  # a cell of the default run that separation.yaml trains otherwise
    (tmp_path / "results" / "data" / "math_test.jsonl").unlink()
    overlay = run_snakemake(tmp_path, "config.yaml", "config/separation.yaml")
    assert overlay.returncode != 0 and "would train 1 of its cells again" in overlay.stderr, overlay.stderr[-3000:]
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
