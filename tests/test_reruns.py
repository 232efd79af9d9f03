"""What reruns a finished training cell (docs/running.md, "What reruns a finished cell"): dry runs on one finished
cell of the embedded study after each kind of edit. An operational edit (tracking, evaluation and checkpoint cadence,
the launcher, a copied run directory, an edited workflow file) schedules no train_rl; an edit of what the cell trains
(its learning rate, its base model, its data) schedules it."""

import copy
import shutil

import pytest
import yaml
from workflow_helpers import ROOT, job_counts, snakemake

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

CELL = "results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~0/summary.json"


def one_cell_config() -> dict:
    """config.yaml with its onpolicy study cut to one cell of two short steps, on the pinned tiny model."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], seeds=[0], health={"collapse_window": 0})
    study["train"].update(steps=2, batch_prompts=2, minibatch_prompts=2, rollouts=2, max_response_tokens=8,
                          eval_every=1, checkpoint_every=1)  # fmt: skip
    config["studies"] = {"onpolicy": study}
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="onpolicy", kl=["k1-reward"], betas=[0.1], seeds=[0], steps=[0])
    config["figures"], config["claims"] = {}, {}
    return config


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run directory in which the one cell has finished."""
    workdir = tmp_path_factory.mktemp("finished")
    config = one_cell_config()
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    snakemake(CELL, "--cores", "2", "--configfile", str(workdir / "config.yaml"), cwd=workdir)
    return workdir, config


def scheduled(workdir, config, *args) -> dict:
    """The jobs a dry run of the cell schedules with ``config`` in ``workdir`` (rule -> count; {} for none)."""
    (workdir / "edited.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    output = snakemake(CELL, "-n", "--cores", "1", "--configfile", str(workdir / "edited.yaml"), *args, cwd=workdir)
    return job_counts(output) if "Job stats:" in output else {}


def edited(config, change) -> dict:
    config = copy.deepcopy(config)
    change(config)
    return config


def test_a_finished_cell_is_done(finished):
    assert scheduled(*finished) == {}


OPERATIONAL = {
    "checkpoint cadence": lambda c: c["studies"]["onpolicy"]["train"].update(checkpoint_every=2),
    "evaluation cadence": lambda c: c["studies"]["onpolicy"]["train"].update(eval_every=2),
    "tracking": lambda c: c["studies"]["onpolicy"]["train"].update(report_to=["tensorboard"]),
    "the launcher": lambda c: c["studies"]["onpolicy"]["train"].update(
        accelerate_config="config/accelerate/cpu-2proc.yaml"
    ),
}


@pytest.mark.parametrize("edit", OPERATIONAL)
def test_an_operational_edit_retrains_no_finished_cell(finished, edit):
    workdir, config = finished
    assert "train_rl" not in scheduled(workdir, edited(config, OPERATIONAL[edit]))


TRAINING = {
    "the learning rate": lambda c: c["studies"]["onpolicy"]["train"].update(learning_rate=2e-4),
    "the base model": lambda c: c["models"]["tiny"]["pinned"].update(sha256="0" * 64),
    "the data": lambda c: c["data"]["math_train"].update(size=c["data"]["math_train"]["size"] - 1),
}


@pytest.mark.parametrize("edit", TRAINING)
def test_an_edit_of_what_a_cell_trains_retrains_it(finished, edit):
    workdir, config = finished
    assert scheduled(workdir, edited(config, TRAINING[edit])).get("train_rl") == 1


def test_a_copied_run_directory_retrains_nothing(finished, tmp_path):
    workdir, config = finished
    copied = tmp_path / "copied"
    shutil.copytree(workdir, copied, symlinks=True)  # copy2: times kept, as cp -a or rsync -a keep them
    assert scheduled(copied, config) == {}


def test_a_moved_clone_with_an_edited_workflow_file_retrains_no_finished_cell(finished, tmp_path):
    """The finished run driven by a copy of the repository elsewhere (its own pinned model files, its own launcher
    paths), with train_rl's shell line edited: the cell is not retrained."""
    workdir, config = finished
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("Snakefile", "workflow", "profiles", "config", "src", "resources"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, clone / name)
    rule = clone / "workflow/rules/train.smk"
    rule.write_text(rule.read_text().replace("2>&1 | tee -a", "2>&1 | tee --append"))
    (workdir / "edited.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    output = snakemake(CELL, "-n", "--cores", "1", "--configfile", str(workdir / "edited.yaml"), "--snakefile",
                       str(clone / "Snakefile"), cwd=workdir)  # fmt: skip
    assert "Job stats:" not in output, output[-2000:]


def test_no_input_names_a_path_outside_the_run_directory(tmp_path):
    """Snakemake's input trigger compares input paths: an absolute one (the pinned copy's files in the clone) would
    restage the base model, and retrain every cell, after the clone moves. The pinned copy's sha256, a param, says
    which build it is."""
    output = snakemake("results/models/tiny", "-n", "--cores", "1", "--configfile", str(ROOT / "config.yaml"),
                       cwd=tmp_path)  # fmt: skip
    inputs = [line for line in output.splitlines() if line.strip().startswith("input:")]
    assert inputs and not [line for line in inputs if str(ROOT) in line], inputs
