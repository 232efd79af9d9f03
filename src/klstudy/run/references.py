"""The references written from the code, so that page and code cannot disagree: the `klstudy` subcommands (from the
parsers), ``KLTrainerConfig`` (from the dataclass, its validation and its logged metrics), the make targets and their
variables (from the Makefile's ``##`` comments and ``?=`` lines) and the environment variables (environment.py).

`python -m klstudy references --out-dir docs` writes docs/cli.md, docs/trainer-config.md, docs/make.md,
docs/environment.md and docs/study-grid.md (each study at both scales, from the two configs);
tests/test_references.py fails when a committed page is not what this module writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from klstudy import environment

ROOT = Path(__file__).resolve().parents[3]
GENERATED = (
    "Written by `.venv/bin/python -m klstudy references --out-dir docs` from {source}; `tests/test_references.py` "
    "fails when this page and the code disagree."
)


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _header(title: str, source: str, about: str) -> list[str]:
    return [f"# {title}", "", f"[← the manual](README.md) · {about} " + GENERATED.format(source=source)]


# ----------------------------------------------------------------------------------------------------- klstudy


def cli_page(parser: argparse.ArgumentParser) -> str:
    """docs/cli.md: each subcommand of ``parser`` (cli.build_parser's), what it does, and its arguments with their
    defaults."""
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    lines = _header("The `klstudy` command", "the parsers (`src/klstudy/run/cli.py`, `stages.py`)",
                    "every subcommand of `.venv/bin/python -m klstudy`, its arguments and their defaults.")  # fmt: skip
    lines += [
        "",
        "The stages (from `toy` to `tables`) are the commands of the workflow's rules, each runnable alone; "
        "the others run from make or by hand. `--help` after a subcommand prints the same.",
        "",
    ]
    lines += [f"- [`{name}`](#{name}): {_cell(helps.get(name, ''))}" for name in commands.choices]
    for name, sub in commands.choices.items():
        lines += ["", f"## {name}", "", _cell(helps.get(name, "")), ""]
        rows = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        if not rows:
            lines.append("No arguments.")
            continue
        lines += ["| argument | default | meaning |", "|---|---|---|"]
        for action in rows:
            flag = ", ".join(action.option_strings) or action.dest
            if not action.help:
                raise ValueError(f"klstudy {name} {flag}: give it a help string (docs/cli.md shows it)")
            default = "required" if action.required else ("–" if action.default in (None, False) else action.default)
            if isinstance(action, argparse._StoreTrueAction):
                default = "off"
            choices = f" One of {', '.join(map(str, action.choices))}." if action.choices else ""
            meaning = _cell(action.help or "").rstrip(".") + ("." if choices else "")
            lines.append(f"| `{flag}` | {_cell(default)} | {meaning}{choices} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ the trainer

# Each way KLTrainerConfig refuses a setting, shown by a setting it refuses (run when the page is written, so the
# message is the code's own). tests/test_references.py checks that every `raise` of its validation is reached.
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
    {"updates_per_batch": 0},
    {"scale_rewards": "group"},
    {"steps_per_generation": 3},
]


def refusals() -> list[tuple[dict, str]]:
    """(setting, the error KLTrainerConfig raises) for each of REFUSED."""
    import tempfile

    from klstudy.train.trainer import KLTrainerConfig

    found = []
    with tempfile.TemporaryDirectory() as out:
        for setting in REFUSED:
            try:
                KLTrainerConfig(output_dir=out, report_to=[], **setting)
            except ValueError as error:
                found.append((setting, str(error)))
            else:
                raise AssertionError(f"KLTrainerConfig accepted {setting}, which REFUSED says it refuses")
    return found


def own_fields(config_class) -> list[dataclasses.Field]:
    """The fields a class declares itself, not those it inherits."""
    own = config_class.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(config_class) if f.name in own]


def trainer_page() -> str:
    """docs/trainer-config.md: KLTrainerConfig's own fields, its refusals and the metrics KLTrainer logs."""
    from klstudy.train.trainer import LOGGED_METRICS, KLTrainerConfig

    lines = _header("`KLTrainerConfig` and `KLTrainer`", "`src/klstudy/train/trainer.py`",
                    "the fields `KLTrainerConfig` adds to TRL's `GRPOConfig` (every other field is TRL's, with "
                    "TRL's default), what it refuses, and what `KLTrainer` logs.")  # fmt: skip
    lines += ["", _cell(KLTrainerConfig.__doc__), "", "## Fields", "", "| field | default | meaning |", "|---|---|---|"]
    for f in own_fields(KLTrainerConfig):
        lines.append(f"| `{f.name}` | `{f.default!r}` | {_cell(f.metadata.get('help', ''))} |")
    lines += ["", "## What it refuses", "", "A refused setting raises `ValueError` when the config is built:", "",
              "| setting | error |", "|---|---|"]  # fmt: skip
    for setting, message in refusals():
        shown = ", ".join(f"{k}={v!r}" for k, v in setting.items())
        lines.append(f"| `{shown}` | {_cell(message)} |")
    lines += ["", "## Logged metrics", "",
              "Beside TRL's own (`loss`, `reward`, `completions/…`), each step logs, in `metrics.jsonl` of a cell and "
              "in TensorBoard or W&B:", "", "| metric | meaning |", "|---|---|"]  # fmt: skip
    lines += [f"| `{name}` | {_cell(meaning)} |" for name, meaning in LOGGED_METRICS.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------- make

TARGET = re.compile(r"^([a-z][\w-]*):(?!=)")
VARIABLE = re.compile(r"^([A-Z][A-Z0-9_]*) \?=[ \t]*(.*)$")


def make_reference(makefile: Path) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The Makefile's phony targets with the ``##`` lines above each, and its ``?=`` variables with their default and
    the ``#`` line above each. A target or variable without its comment is an error naming it."""
    text = re.sub(r"[ \t]*\\\n\s*", " ", makefile.read_text())  # continuation lines joined
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
    targets, variables, pending, above = {}, {}, [], ""
    for line in text.splitlines():
        if line.startswith("## "):
            pending.append(line[3:])
        elif line.startswith("# "):
            above = line[2:]
            continue
        elif match := TARGET.match(line):
            if match.group(1) in phony:
                targets[match.group(1)] = " ".join(pending)
            pending = []
        elif match := VARIABLE.match(line):
            variables[match.group(1)] = (match.group(2), above)
        above = ""
    undocumented = [t for t in phony if not targets.get(t)] + [v for v, (_, about) in variables.items() if not about]
    if undocumented:
        raise ValueError(f"{makefile}: give these a comment (## above a target, # above a variable): {undocumented}")
    return targets, variables


def make_page(makefile: Path = ROOT / "Makefile") -> str:
    """docs/make.md: every target and every variable a command line may set."""
    targets, variables = make_reference(makefile)
    lines = _header(
        "Make targets and variables",
        "the `Makefile`",
        "every `make` target, and every variable a command line may set (`make study CORES=4`).",
    )
    lines += ["", "## Targets", "", "| target | what it does |", "|---|---|"]
    lines += [f"| `make {name}` | {_cell(about)} |" for name, about in targets.items()]
    lines += ["", "## Variables", "", "| variable | default | what it sets |", "|---|---|---|"]
    lines += [f"| `{name}` | {f'`{default}`' if default else '(empty)'} | {_cell(about)} |"
              for name, (default, about) in variables.items()]  # fmt: skip
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------- the two scales' grids

# What a study's settings say, in the order a reader compares them: its grid, then how each cell trains.
STUDY_KEYS = ["models", "train_data", "heldout_data", "kl", "betas", "seeds"]
TRAIN_KEYS = ["steps", "batch_prompts", "minibatch_prompts", "rollouts", "max_response_tokens", "learning_rate",
              "advantage", "loss_type", "async_level", "policy_loss", "k3_clamp", "heldout_decoding",
              "vllm_importance_sampling", "generation", "micro_batch"]  # fmt: skip


# What both scales evaluate: lm-eval's settings and Fig. 12's.
EVALUATED = {
    "evaluation": ["tasks", "studies", "k", "min_p", "max_tokens", "study_max_tokens", "backend", "seeds"],
    "divergence": ["study", "kl", "betas", "seeds", "steps", "tasks", "prompts", "samples", "max_tokens",
                   "snapshot_dtype"],
}  # fmt: skip


def _value(value) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{key}: {_value(item)}" for key, item in value.items()) or "–"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return "–" if value is None else str(value)


def study_grid_page(embedded_path: Path = ROOT / "config.yaml", paper_path: Path = ROOT / "config" / "paper.yaml"):
    """docs/study-grid.md: each study of the embedded config beside the paper's, setting by setting (differences in
    bold), from the two validated configs."""
    import yaml

    from klstudy.config import validate_config

    embedded, paper = (validate_config(yaml.safe_load(p.read_text())) for p in (embedded_path, paper_path))
    lines = _header("The studies at both scales", "`config.yaml` and `config/paper.yaml`",
                    "each study of the embedded config (`config.yaml`) beside the paper's (`config/paper.yaml`), "
                    "setting by setting (a setting that differs is in bold), then what both scales evaluate. "
                    "`vllm_importance_sampling` acts only where `generation` is `vllm`.")  # fmt: skip
    for study in paper["studies"]:
        ours, theirs = embedded["studies"].get(study), paper["studies"][study]
        lines += ["", f"## {study}", "", _cell(theirs.get("description", "")), ""]
        if ours is None:
            lines.append("The embedded config has no such study.")
            continue
        lines += ["| setting | embedded | paper |", "|---|---|---|"]
        rows = [(key, ours.get(key), theirs.get(key)) for key in STUDY_KEYS]
        rows += [(key, ours["train"].get(key), theirs["train"].get(key)) for key in TRAIN_KEYS]
        rows += [("health.collapse_window", ours["health"]["collapse_window"], theirs["health"]["collapse_window"])]
        rows += [("gpus", ours.get("gpus", embedded["resources"]["train"]["gpus"]),
                  theirs.get("gpus", paper["resources"]["train"]["gpus"]))]  # fmt: skip
        lines += [_side_by_side(*row) for row in rows]
    for section, keys in EVALUATED.items():
        lines += ["", f"## {section}", "", "| setting | embedded | paper |", "|---|---|---|"]
        lines += [_side_by_side(key, embedded[section].get(key), paper[section].get(key)) for key in keys]
    return "\n".join(lines) + "\n"


def _side_by_side(key: str, embedded_value, paper_value) -> str:
    """A setting's row of docs/study-grid.md: both scales' values, in bold where they differ."""
    shown = [_cell(_value(v)) for v in (embedded_value, paper_value)]
    if embedded_value != paper_value:
        shown = [f"**{v}**" for v in shown]
    return f"| `{key}` | {shown[0]} | {shown[1]} |"


# ------------------------------------------------------------------------------------------------- all of them


def pages(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each generated page's file name under docs/ and its text; ``parser``: the `klstudy` command's."""
    return {"cli.md": cli_page(parser), "trainer-config.md": trainer_page(), "make.md": make_page(),
            "environment.md": environment.page(), "study-grid.md": study_grid_page()}  # fmt: skip


def write(out_dir: Path, parser: argparse.ArgumentParser) -> list[Path]:
    written = []
    for name, text in pages(parser).items():
        (out_dir / name).write_text(text)
        written.append(out_dir / name)
    return written
