"""Whose run a working directory holds, so that a run of other configs cannot overwrite it unnoticed.

An overlay (``make study CONFIG="config.yaml config/separation.yaml"``) names cells at the same paths as the
default's (results/runs/<study>/<model>/<kl>/beta~<β>/seed~<seed>) with other settings, and writes the same figures/
and report.html. So the workflow records, when it starts jobs, which config files made the run in
results/run-configs.json, and refuses a run of other config files whose cells would land where the recorded run's
already are, naming the directory and the way out: a directory of its own (``RUN_DIR=``, Snakemake's
``--directory``), or removing the record to replace that run. A run whose cells are all new there (the 7-8B pilot after
the 0.5B one, the paper's study after its pilots) goes on and is recorded; the same configs always go on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from klstudy.config import RUN_DIR, all_cells

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


def claim(config: dict, configfiles, repository: Path, workdir: Path) -> None:
    """Record this run's config files in ``workdir``, or raise RunClash if another configs' run has cells there that
    this one would overwrite."""
    names = config_names(configfiles, repository)
    record = workdir / RECORD
    if record.is_file():
        held = json.loads(record.read_text())["configs"]
        if held != names:
            shared = [path for cell in all_cells(config) if (workdir / (path := RUN_DIR.format(**cell))).exists()]
            if shared:
                raise RunClash(
                    f"{workdir.resolve()}/results holds the run of {' + '.join(held)} ({RECORD}); this run of "
                    f"{' + '.join(names)} would overwrite {len(shared)} of its cells (e.g. {shared[0]}) and its "
                    f"figures/ and report.html. Run it in a directory of its own: make study CONFIG=\"{' '.join(names)}\" "
                    f"RUN_DIR=runs/<name> (snakemake --directory runs/<name>); or, to replace that run, delete {RECORD}."
                )
    record.parent.mkdir(parents=True, exist_ok=True)
    temporary = record.with_suffix(".tmp")
    temporary.write_text(json.dumps({"configs": names}, indent=1) + "\n")
    os.replace(temporary, record)
