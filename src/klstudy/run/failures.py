"""What ended a training job's attempt, read from the cell's attempt history (logs/attempts/train/<cell>.log), and
what its retry therefore does (workflow/rules/common.smk, `klstudy last-failure`):

    deterministic  out of GPU memory (torch's or vLLM's), a module that does not import, a config refused, CUDA that
                   does not start (a torch build the driver cannot run, a job that sees no CUDA device): the same job
                   fails the same way on the next node. Not retried: a run fails such a cell on the submit host
                   (train.smk's refused_train_rl); a retry within the run, which Snakemake makes by count alone, is
                   the smallest job, whose shell names the failure and exits (common.smk's REFUSED_RETRY).
    node           the node or its GPUs (an ECC error, a busy or failed driver, an Xid, a collective that failed):
                   retried on another node (sbatch --exclude=<the node>) for cluster.exclude_node_hours.
    other          anything else (a kill, a time limit, an error not listed): retried as it was.

Whatever the kind, a cell gets cluster.max_attempts SLURM jobs in all, counted in its history, so across drivers (each
of which counts its own retries from zero); a requeued slice or a preempted job is the same job.

The patterns are the messages torch, NCCL, Python and klstudy print: a deterministic failure anywhere in an attempt's
output decides, else a node's. A history is parsed once for each version of the file (its size and time), however
many of a retry's resources ask.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

HEADER = re.compile(r"^=== attempt (\d+): job (\S+) on (\S+), GPUs (\S+), (\S+)$", re.M)  # common.smk's ATTEMPT_HEADER
RETRY = {
    "deterministic": "not retried: it fails the same way on any node; fix it, move the history away and run again",
    "node": "retried on another node",
    "other": "retried",
}
SLICE_END = "slice: requeueing job"  # an attempt that ended so did not fail (common.smk's REQUEUE_SLICE)
PATTERNS = {
    "deterministic": [
        ("out of GPU memory", r"OutOfMemoryError|CUDA out of memory"),
        # vLLM 0.30.0's engine start (v1/core/kv_cache_utils.py, v1/worker/utils.py): too little memory for its cache
        ("out of vLLM's GPU memory", r"No available memory for the cache blocks|KV cache is needed, which is larger "
         r"than the available KV cache memory|on startup is less than desired GPU memory utilization"),
        # torch's (c10/cuda/CUDAFunctions.cpp), klstudy's (devices.require_cuda): a build that cannot use CUDA here
        ("CUDA that does not start", r"NVIDIA driver on your system is too old|Found no NVIDIA driver on your system|"
         r"No CUDA GPUs are available|no CUDA-capable device is detected|sees no CUDA device"),
        ("an import error", r"^(ModuleNotFoundError|ImportError): "),
        ("a config refused", r"^klstudy [\w-]+: config key |ConfigError: "),
    ],
    "node": [
        ("a GPU error", r"uncorrectable ECC error|CUDA driver initialization failed|CUDA-capable device\(s\) is/are "
         r"busy or unavailable|NVRM: Xid|\bXid \d+"),
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
    job: str = ""  # its SLURM job ("local" without one)
    ended: float = 0.0  # when it ended at the latest (seconds since the epoch): the next attempt's start, or the file's

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
    headers = list(HEADER.finditer(history))
    ends = [header.start() for header in headers[1:]] + [len(history)]
    return [(header, history[header.end() : end].strip("\n")) for header, end in zip(headers, ends, strict=True)]


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
    starts = [datetime.fromisoformat(header[5]).timestamp() for header, _ in found[1:]] + [mtime_ns / 1e9]
    return tuple(Failure(*classify(output), int(header[1]), header[3], SLICE_END in output, header[2], ended)
                 for (header, output), ended in zip(found, starts, strict=False))  # fmt: skip


def previous_failure(history_path: Path) -> Failure | None:
    """What ended the last attempt in the history, or None where there is none."""
    return (failures(history_path) or [None])[-1]


def failed_nodes(history_path: Path, hours: float, now: float | None = None) -> list[str]:
    """The nodes of the attempts that failed with a node failure (not one that ended a slice) within the last
    ``hours``: a retry excludes them (a node is repaired or drained by then). The history records the node of the
    job's first task: on several nodes, that one."""
    since = (time.time() if now is None else now) - 3600 * hours
    found = failures(history_path)
    return sorted({f.host for f in found if f.kind == "node" and not f.ended_slice and f.ended >= since})


def jobs(history_path: Path) -> int:
    """The SLURM jobs the cell has had: its attempts' distinct job ids (a requeued slice or a preempted job keeps its
    id). Attempts outside SLURM ("local") are not counted: one machine's runs are retried as --retries says."""
    return len({f.job for f in failures(history_path) if f.job != "local"})


def report(history_path: Path, max_attempts: int = 0) -> str:
    """`klstudy last-failure`: what ended the last attempt and what its retry does, or that the cell has had its
    ``max_attempts`` (cluster.max_attempts) jobs and how to go on."""
    failure = previous_failure(history_path)
    said = f"{failure.describe()} ({failure.kind}: {RETRY[failure.kind]})" if failure else "no attempt recorded"
    if max_attempts and jobs(history_path) >= max_attempts:
        said = f"{jobs(history_path)} jobs, the most cluster.max_attempts ({max_attempts}) allows; the last {said}"
        return f"{history_path}: {said}. Once its cause is fixed, move the history away (or raise the key) to go on"
    return said if failure else f"{history_path}: {said}"
