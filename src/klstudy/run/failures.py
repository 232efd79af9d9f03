"""What ended a training job's attempt, read from the cell's attempt history (logs/attempts/train/<cell>.log), and
what its retry therefore does (workflow/rules/common.smk, `klstudy last-failure`):

    deterministic  out of GPU memory, a module that does not import, a config refused: the same job on any node fails
                   the same way. Not retried: Snakemake, which retries by count alone, submits a one-CPU, one-minute
                   job that fails at once naming the first failure, instead of 8 GPUs to fail again.
    node           the node or its GPUs (an ECC error, a driver that does not answer, a GPU job that sees none, a
                   collective that failed): retried on another node (sbatch --exclude=<the node>).
    other          anything else (a kill, a time limit, an error not listed): retried as it was.

The patterns are the messages torch, NCCL, Python and klstudy print: a deterministic failure anywhere in an attempt's
output decides, else a node's. A history is parsed once for each version of the file (its size and time), however
many of a retry's resources ask.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

HEADER = re.compile(r"^=== attempt (\d+): job (\S+) on (\S+), GPUs (\S+), (\S+)$")  # common.smk's ATTEMPT_HEADER
RETRY = {
    "deterministic": "not retried: it fails the same way on any node; fix it and run the workflow again",
    "node": "retried on another node",
    "other": "retried",
}
SLICE_END = "next-slice: stopped after step"  # an attempt that ended so did not fail (train/slices.py)
PATTERNS = {
    "deterministic": [
        ("out of GPU memory", r"OutOfMemoryError|CUDA out of memory"),
        ("an import error", r"^(ModuleNotFoundError|ImportError): "),
        ("a config refused", r"^klstudy [\w-]+: config key |ConfigError: "),
    ],
    "node": [
        ("a GPU error", r"uncorrectable ECC error|CUDA driver initialization failed|CUDA-capable device\(s\) is/are "
         r"busy or unavailable|no CUDA-capable device is detected|sees no CUDA device|NVRM: Xid|\bXid \d+"),
        ("a collective's error", r"NCCL error|ncclSystemError|ncclUnhandledCudaError|Watchdog caught collective"),
    ],
}  # fmt: skip


@dataclass(frozen=True)
class Failure:
    kind: str  # deterministic | node | other
    what: str  # e.g. "out of GPU memory"
    line: str  # the line of the attempt's output that says so ("" for other)
    attempt: int
    host: str  # the node the attempt ran on
    ended_slice: bool = False  # it stopped before its time limit and requeued its job: no failure of its node

    def describe(self) -> str:
        said = f": {self.line}" if self.line else ""
        return f"attempt {self.attempt} on {self.host} ended with {self.what}{said}"


def classify(output: str) -> tuple[str, str, str]:
    """(kind, what, line) of one attempt's output: a deterministic failure anywhere in it decides, else a node's, each
    by its last line. (One rank out of memory leaves the others' NCCL watchdogs to report after it: an OOM, not a bad
    node.)"""
    lines = output.splitlines()
    for kind, patterns in PATTERNS.items():
        for line in reversed(lines):
            for what, pattern in patterns:
                if re.search(pattern, line):
                    return kind, what, line.strip()[:300]
    return "other", "an error not classified", ""


def attempts(history: str) -> list[tuple[re.Match, str]]:
    """(header, output) of each attempt in a history, oldest first."""
    found, current = [], None
    for line in history.splitlines():
        header = HEADER.match(line)
        if header:
            current = [header, []]
            found.append(current)
        elif current:
            current[1].append(line)
    return [(header, "\n".join(lines)) for header, lines in found]


def failures(history_path: Path) -> list[Failure]:
    """What ended each attempt in the history, oldest first (the one running now, if any, included)."""
    path = Path(history_path)
    if not path.exists():
        return []
    stat = path.stat()
    return list(_parsed(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=256)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[Failure, ...]:
    """The failures of one version of a history file (its size and time are part of the key)."""
    found = attempts(Path(path).read_text(errors="replace"))
    return tuple(Failure(*classify(output), int(header[1]), header[3], SLICE_END in output) for header, output in found)


def previous_failure(history_path: Path) -> Failure | None:
    """What ended the last attempt in the history, or None where there is none."""
    found = failures(history_path)
    return found[-1] if found else None


def failed_nodes(history_path: Path) -> list[str]:
    """The nodes of every attempt that failed with a node failure (not one that ended a slice): a retry excludes
    them. The history records the node of the job's first task: on several nodes, that one."""
    return sorted({f.host for f in failures(history_path) if f.kind == "node" and not f.ended_slice})


def report(history_path: Path) -> str:
    """`klstudy last-failure`: what ended the last attempt, and what its retry does."""
    failure = previous_failure(history_path)
    if failure is None:
        return f"{history_path}: no attempt recorded"
    return f"{failure.describe()} ({failure.kind}: {RETRY[failure.kind]})"
