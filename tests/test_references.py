"""The references written from the code (src/klstudy/run/references.py) are what the code says: each committed page
is what its generator writes now, every environment variable any file reads is declared in environment.py, every
refusal of KLTrainerConfig is a ValueError and every metric KLTrainer logs is described."""

import argparse
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from klstudy import environment, kl
from klstudy.run import references

pytestmark = pytest.mark.docs  # the documentation tier: `make test-docs` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generated():
    from klstudy.run import cli

    return references.pages(cli.build_parser())


@pytest.mark.parametrize("name", ["cli.md", "trainer-config.md", "make.md", "environment.md", "study-grid.md"])
def test_each_generated_page_is_what_the_code_writes(name, generated):
    committed = (ROOT / "docs" / name).read_text()
    stale = f"docs/{name} is stale: run .venv/bin/python -m klstudy references --out-dir docs"
    assert committed == generated[name], stale


GENERATED = {".git", "results", "figures", "logs", "runs", "models", ".snakemake", "__pycache__", "docs"}


def tracked_files() -> list[Path]:
    """The repository's files: git's list, or in a copy that is no checkout, every file outside what runs generate."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0:
        names = listed.stdout.split()
        return [ROOT / name for name in names if (ROOT / name).is_file() and not name.startswith("docs/")]
    found = []
    for path in ROOT.rglob("*"):
        folders = path.relative_to(ROOT).parts[:-1]
        if path.is_file() and not set(folders) & GENERATED and not any(f.startswith(".venv") for f in folders):
            found.append(path)
    return found


def test_every_klstudy_variable_any_file_names_is_declared_and_every_declared_one_is_read():
    named = {}
    for path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name in re.findall(r"KLSTUDY_[A-Z0-9_]+", text):
            named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    undeclared = {name: sorted(files) for name, files in named.items() if name not in environment.VARIABLES}
    assert undeclared == {}, f"declare these in src/klstudy/environment.py: {undeclared}"
    declared = {name for name in environment.VARIABLES if name.startswith("KLSTUDY_")}
    unread = declared - {n for n, files in named.items() if files - {"src/klstudy/environment.py"}}
    assert unread == set(), f"declared in environment.py but read nowhere: {unread}"


def test_every_variable_the_package_reads_from_the_environment_is_declared():
    read = set()
    for path in (ROOT / "src").rglob("*.py"):
        text = path.read_text()
        read |= set(re.findall(r"\b(?:environ|env)(?:\.get\(|\[)\s*\"([A-Z][A-Z0-9_]*)\"", text))
    assert read, "the scan found no read at all: its pattern is wrong"
    assert read - set(environment.VARIABLES) == set()


def test_an_undeclared_variable_cannot_be_read():
    with pytest.raises(KeyError, match="not declared"):
        environment.get("KLSTUDY_" + "NO_SUCH_THING")  # split: the scan of every file above would find it


# Each way KLTrainerConfig refuses a setting, shown by a setting it refuses.
REFUSED = [
    {"kl_estimator": "k9"},
    {"kl_placement": "reward_and_loss"},
    {"beta": -0.1},
    {"kl_loss_gradient": "detached"},
    {"kl_clamp": 0.0},
    {"kl_placement": "reward", "kl_loss_gradient": "ratio"},
    {"policy_loss": "gspo"},
    {"advantage": "none"},
    {"loss_type": "grpo"},
    {"advantage": "grpo"},  # the group mean is "mean" (GRPO itself divides by the std: group_std)
    {"updates_per_batch": 0},
    {"scale_rewards": "group"},
    {"steps_per_generation": 3},
]


def test_every_refusal_of_the_trainer_config_is_a_value_error_with_a_message(tmp_path):
    """Each `raise` of KLTrainerConfig's and KLSpec's validation runs for one of REFUSED, as the ValueError that
    docs/trainer-config.md promises (refusal fails on any setting accepted)."""
    from klstudy.train.trainer import KLTrainerConfig

    def refusal(setting: dict) -> str:
        with pytest.raises(ValueError) as refused:
            KLTrainerConfig(output_dir=str(tmp_path), report_to=[], **setting)
        return str(refused.value)

    checks = [KLTrainerConfig.__post_init__, kl.KLSpec.__post_init__]
    raises = set()
    for function in checks:
        lines, first = inspect.getsourcelines(function)
        raises |= {(function.__code__, first + i) for i, line in enumerate(lines) if line.strip().startswith("raise")}
    reached = set()

    def tracer(frame, event, arg):
        if frame.f_code in {f.__code__ for f in checks}:
            return lambda frame, event, arg: reached.add((frame.f_code, frame.f_lineno)) or None
        return None

    sys.settrace(tracer)
    try:
        messages = [refusal(setting) for setting in REFUSED]
    finally:
        sys.settrace(None)
    missed = sorted(line for code, line in raises - reached)
    assert missed == [], f"no setting of REFUSED reaches the raise at these lines: {missed}"
    assert all(messages)


def test_every_metric_the_trainer_logs_is_described():
    from klstudy.train import trainer

    source = Path(trainer.__file__).read_text()
    logged = set(re.findall(r"metrics(?:\[\"(?:train|eval)\"\])?\[f?\"([^\"]+)\"\]", source))
    logged = {name.replace("{estimator}", e) for name in logged - {"train", "eval"} for e in ("k1", "k3")}
    assert "entropy" in logged and "kl_k3" in logged, "the scan missed metrics: its pattern is wrong"
    assert logged - set(trainer.LOGGED_METRICS) == set()


def test_a_make_target_or_variable_without_its_comment_is_refused(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text(".PHONY: a b\n## A does this.\na:\n\ttrue\n\nb:\n\ttrue\n# what X sets\nX ?= 1\nY ?= 2\n")
    with pytest.raises(ValueError, match=r"\['b', 'Y'\]"):
        references.make_reference(makefile)
    makefile.write_text(".PHONY: a\n## A does this.\na:\n\ttrue\n# what X sets\nX ?= 1 \\\n  2\n")
    assert references.make_reference(makefile) == ({"a": "A does this."}, {"X": ("1 2", "what X sets")})


def test_every_variable_the_workflows_shell_reads_is_declared():
    """The job preamble, the multi-node launch and the driver job read variables in the shell: each is on the page."""
    files = [ROOT / "Snakefile", *(ROOT / "workflow" / "rules").glob("*.smk"), ROOT / "slurm" / "driver.sbatch"]
    read = set()
    for path in files:
        read |= set(re.findall(r"\$\{{0,2}([A-Z][A-Z0-9_]+)", path.read_text()))
    generic = {"PATH", "PYTHONPATH", "PWD", "HOME"}  # the shell's own
    assert read, "the scan found no variable at all: its pattern is wrong"
    assert read - generic - set(environment.VARIABLES) == set()


def test_an_argument_without_help_is_refused():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sub.add_parser("stage", help="a stage").add_argument("--out", required=True)
    with pytest.raises(ValueError, match="stage --out: give it a help string"):
        references.cli_page(parser)


def test_a_make_targets_first_sentence_ends_at_a_sentences_end():
    assert references.first_sentence("Every cell, e.g. one. `make x` does more.") == "Every cell, e.g. one."
    assert references.first_sentence("No full stop here") == "No full stop here"


def test_the_workflows_subcommands_are_found_in_its_rules():
    """docs/cli.md lists apart the subcommands the rules run: the scan must find the stages, and only subcommands."""
    from klstudy.run import cli

    (commands,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    found = references.workflow_subcommands()
    assert {"train", "evaluate", "prepare-data", "toy"} <= found <= set(commands.choices)
