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
from klstudy.run.config_reference import flow

ROOT = Path(__file__).resolve().parents[3]
# Each page says where it comes from; this module's docstring says how to write it again.
GENERATED = "Written from {source}."


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _header(title: str, source: str, about: str) -> list[str]:
    return [f"# {title}", "", f"[← the manual](README.md) · {about} " + GENERATED.format(source=source)]


# ----------------------------------------------------------------------------------------------------- klstudy


def cli_page(parser: argparse.ArgumentParser) -> str:
    """docs/cli.md: each subcommand of ``parser`` (cli.build_parser's) and what it does; its arguments are its
    ``--help``'s, and an argument without a help string is refused here, so that every ``--help`` is complete."""
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if not action.help:
                flag = ", ".join(action.option_strings) or action.dest
                raise ValueError(f"klstudy {name} {flag}: give it a help string (its --help shows it)")
    rules = workflow_subcommands()
    lines = _header("The `klstudy` command", "the parsers (`src/klstudy/run/cli.py`, `stages.py`)",
                    "every subcommand of `.venv/bin/python -m klstudy`; `SUBCOMMAND --help` prints its arguments "
                    "and their defaults.")  # fmt: skip
    lines += ["", "| subcommand | what it does |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(helps.get(name, ''))} |" for name in commands.choices if name not in rules]
    lines += ["", "The workflow's rules run the others, each runnable alone: "
              + ", ".join(f"`{name}`" for name in commands.choices if name in rules) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def workflow_subcommands(rules: Path = ROOT / "workflow" / "rules") -> set[str]:
    """The subcommands the workflow's rules run (`python -m klstudy NAME`)."""
    return {name for path in rules.glob("*.smk") for name in re.findall(r"-m klstudy ([a-z][\w-]*)", path.read_text())}


# ------------------------------------------------------------------------------------------------ the trainer

def trainer_page() -> str:
    """docs/trainer-config.md: KLTrainerConfig's own fields and the metrics KLTrainer logs."""
    from klstudy.train.trainer import LOGGED_METRICS, KLTrainerConfig

    lines = _header("`KLTrainerConfig` and `KLTrainer`", "`src/klstudy/train/trainer.py`",
                    "the fields `KLTrainerConfig` adds to TRL's `GRPOConfig` (every other field is TRL's, with "
                    "TRL's default) and what `KLTrainer` logs.")  # fmt: skip
    lines += ["", _cell(KLTrainerConfig.__doc__), "", "## Fields", "", "| field | default | meaning |", "|---|---|---|"]
    own = KLTrainerConfig.__dict__["__annotations__"]  # its fields, not those it inherits
    lines += [f"| `{f.name}` | `{f.default!r}` | {_cell(f.metadata.get('help', ''))} |"
              for f in dataclasses.fields(KLTrainerConfig) if f.name in own]  # fmt: skip
    lines += ["", "A setting it refuses raises `ValueError` when the config is built, naming the field."]
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


def first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence (one followed by anything but a lower-case word)."""
    return re.split(r"(?<=\.)\s+(?![a-z])", text, maxsplit=1)[0]


def make_page(makefile: Path = ROOT / "Makefile") -> str:
    """docs/make.md: every target, with the first sentence of its comment (the Makefile's comment says the rest), and
    every variable a command line may set."""
    targets, variables = make_reference(makefile)
    lines = _header(
        "Make targets and variables",
        "the `Makefile`",
        "every `make` target, and every variable a command line may set (`make study CORES=4`). The comment above "
        "a target in the `Makefile` says more.",
    )
    testing = [name for name in targets if name.startswith("test") or name.endswith("-env") or name == "lint"]
    lines += ["", "## Targets", "", "| target | what it does |", "|---|---|"]
    lines += [f"| `make {name}` | {_cell(first_sentence(about))} |" for name, about in targets.items()
              if name not in testing]  # fmt: skip
    lines += ["", "The tests, their environments and the linters, each tier on [testing](testing.md): "
              + ", ".join(f"`make {name}`" for name in testing) + "."]  # fmt: skip
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
COMPARED = "| setting | embedded | paper |\n|---|---|---|"


def study_grid_page(embedded_path: Path = ROOT / "config.yaml", paper_path: Path = ROOT / "config" / "paper.yaml"):
    """docs/study-grid.md: the first study of the paper's config at both scales, setting by setting (differences in
    bold), then a row per other study with what it changes, from the two validated configs."""
    import yaml

    from klstudy.config import validate_config

    embedded, paper = (validate_config(yaml.safe_load(p.read_text())) for p in (embedded_path, paper_path))
    lines = _header("The studies at both scales", "`config.yaml` and `config/paper.yaml`",
                    "each study of `config.yaml` beside `config/paper.yaml`'s (embedded / paper, in bold where the "
                    "scales differ). A study trains every model × KL configuration × β × seed it lists (`none`: no "
                    "KL, at β = 0).")  # fmt: skip
    (head, *others) = paper["studies"]
    first = _settings(head, embedded, paper)
    lines += ["", f"## {head}", "", _cell(paper["studies"][head].get("description", "")), "", COMPARED]
    lines += [_compared(*row, table=True) for row in first]
    lines += ["", "## The other studies", "", f"| study | what it is | as `{head}`, but |", "|---|---|---|"]
    for study in others:
        about = _cell(paper["studies"][study].get("description", ""))
        changed = [_compared(*row) for row in _settings(study, embedded, paper) if row not in first]
        shown = "; ".join(changed) or "nothing" if study in embedded["studies"] else "the embedded config has none"
        lines.append(f"| `{study}` | {about} | {shown} |")
    for section, keys in EVALUATED.items():
        lines += ["", f"## {section}", "", COMPARED]
        lines += [_compared(key, embedded[section].get(key), paper[section].get(key), table=True) for key in keys]
    return "\n".join(lines) + "\n"


def _compared(key: str, embedded_value, paper_value, table: bool = False) -> str:
    """A setting at both scales, in bold where they differ: a table's row, or a study's row's item."""
    ours, theirs = (_cell(flow(v)) for v in (embedded_value, paper_value))
    if table:
        return f"| `{key}` | {ours} | same |" if ours == theirs else f"| `{key}` | **{ours}** | **{theirs}** |"
    return f"`{key}` {ours}" if ours == theirs else f"`{key}` **{ours}** / **{theirs}**"


def _settings(study: str, embedded: dict, paper: dict) -> list[tuple]:
    """A study's (setting, embedded value, paper value) rows, in the order a reader compares them; none where the
    embedded config has no such study."""
    if study not in embedded["studies"]:
        return []
    ours, theirs = embedded["studies"][study], paper["studies"][study]
    rows = [(key, ours.get(key), theirs.get(key)) for key in STUDY_KEYS]
    rows += [(key, ours["train"].get(key), theirs["train"].get(key)) for key in TRAIN_KEYS]
    rows += [("health.collapse_window", ours["health"]["collapse_window"], theirs["health"]["collapse_window"])]
    rows += [("gpus", ours.get("gpus", embedded["resources"]["train"]["gpus"]),
              theirs.get("gpus", paper["resources"]["train"]["gpus"]))]  # fmt: skip
    return rows


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
