"""Whose run a working directory holds, so that a run of other configs cannot overwrite it unnoticed.

An overlay (``make study CONFIG="config.yaml config/separation.yaml"``) names cells at the same paths as the
default's (results/runs/<study>/<model>/<kl>/beta~<β>/seed~<seed>) with other settings, and writes the same figures/
and report.html. So when the workflow starts jobs it records in results/run-configs.json which config files made the
run and a digest of each cell's settings (its trainer settings, model and data), and refuses a run of other config
files that would train a cell already there with other settings, naming the directory and the way out: a directory of
its own (``RUN_DIR=``, Snakemake's ``--directory``), or removing the record to replace that run. A run that only adds
cells (a model or a study in an overlay, the paper's study after its pilot) goes on, and the same config files always
go on (an edited config.yaml reruns what it changed, as Snakemake does).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from klstudy.config import RUN_DIR, all_cells, cell_settings, training_settings

RECORD = Path("results") / "run-configs.json"


class RunClash(RuntimeError):
    """A run of other configs would overwrite the cells of the run this directory holds."""


def config_names(configfiles, repository: Path) -> list[str]:
    """The config files as a user names them: relative to the repository where inside it, else absolute."""
    names = []
    for path in configfiles:
        path = Path(path).resolve()
        inside = path.is_relative_to(repository.resolve())
        names.append(str(path.relative_to(repository.resolve())) if inside else str(path))
    return names


def cell_digests(config: dict) -> dict[str, str]:
    """Each cell's directory and a digest of what it trains: its settings, its model and its data."""
    digests = {}
    for cell in all_cells(config):
        study = config["studies"][cell["study"]]
        what = dict(training_settings(cell_settings(config, **cell)), model_spec=config["models"][cell["model"]],
                    data=[config["data"][study[key]] for key in ("train_data", "heldout_data")])  # fmt: skip
        text = json.dumps(what, sort_keys=True, default=str)
        digests[RUN_DIR.format(**cell)] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return digests


def claim(config: dict, configfiles, repository: Path, workdir: Path) -> None:
    """Record this run's config files and cells in ``workdir``, or raise RunClash if another configs' run has cells
    there that this one would train with other settings."""
    names, digests = config_names(configfiles, repository), cell_digests(config)
    record, held = workdir / RECORD, {"configs": names, "cells": {}}
    if record.is_file():
        held = json.loads(record.read_text())
        changed = [path for path, digest in digests.items()
                   if held["cells"].get(path, digest) != digest and (workdir / path).exists()]  # fmt: skip
        if held["configs"] != names and changed:
            raise RunClash(
                f"{workdir.resolve()}/results holds the run of {' + '.join(held['configs'])} ({RECORD}); this run of "
                f"{' + '.join(names)} would train {len(changed)} of its cells again with other settings (e.g. "
                f"{changed[0]}) and replace its figures/ and report.html. Run it in a directory of its own: make "
                f'study CONFIG="{" ".join(names)}" RUN_DIR=runs/<name> (snakemake --directory runs/<name>); or, '
                f"to replace that run, delete {RECORD}."
            )
    record.parent.mkdir(parents=True, exist_ok=True)
    temporary = record.with_suffix(".tmp")
    temporary.write_text(json.dumps({"configs": names, "cells": {**held["cells"], **digests}}, indent=1) + "\n")
    os.replace(temporary, record)
