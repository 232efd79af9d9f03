"""What drawing a run's figures costs, this checkout's figure code against another revision's, side by side.

    .venv/bin/python benchmarks/figure_cost.py --old 5f5ae0f                       # docs/embedded's tables
    .venv/bin/python benchmarks/figure_cost.py --old 5f5ae0f --folder docs/smollm2 --repeats 3

Each code draws the same shipped tables (``--folder``/tables) with `klstudy redraw`, one process a draw, into a
scratch copy of the folder; the two alternate, ``--repeats`` times each, so that the machine's load falls on both.
The old revision is checked out as a git worktree and put first on PYTHONPATH (its figure code and its redraw; the
venv's packages are shared). Prints each draw's CPU seconds (user + system of the process) and wall seconds, the
medians, and the ratio new / old of the median CPU seconds: the figure jobs of `make study` cost what these draws do,
less Snakemake's start of each job.
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _draw(src: Path, tables: Path, scratch: Path) -> tuple[float, float, str]:
    """One `klstudy redraw` of ``tables`` by the code under ``src``: (CPU seconds, wall seconds, its last line)."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    shutil.copytree(tables, scratch / "tables")
    env = {**os.environ, "PYTHONPATH": str(src)}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "klstudy", "redraw", str(scratch)], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stdout.strip().splitlines()[-1][:70]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the git revision whose figure code is compared")
    parser.add_argument("--folder", default="docs/embedded", help="a shipped folder with tables/ (%(default)s)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tables = ROOT / args.folder / "tables"
    if not tables.is_dir():
        raise SystemExit(f"{args.folder}: no tables/ to draw from")
    with tempfile.TemporaryDirectory() as work:
        old_tree = Path(work) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old_tree), args.old],
                       check=True)  # fmt: skip
        try:
            cpu = {"old": [], "new": []}
            for repeat in range(args.repeats):
                for which, src in (("old", old_tree / "src"), ("new", ROOT / "src")):
                    seconds, wall, said = _draw(src, tables, Path(work) / f"{which}-{repeat}")
                    cpu[which].append(seconds)
                    print(f"{which} {repeat + 1}: {seconds:6.1f} CPU s, {wall:6.1f} wall s  ({said})")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False)
    old, new = statistics.median(cpu["old"]), statistics.median(cpu["new"])
    print(f"median CPU seconds: old {old:.1f}, new {new:.1f}; ratio new / old {new / old:.2f}")


if __name__ == "__main__":
    main()
