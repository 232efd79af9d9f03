"""The user's disk quota where results/ lies, for the preflight's disk row: on a cluster's shared file system the free
space is petabytes, and the limit that stops a checkpoint is the quota.

Asked, in order: Lustre's `lfs quota -q -u USER MOUNT` (where the file system is lustre), then the Linux quota tools'
`quota -w -u USER` (the row of the file system's device). Each gives kilobytes used, the soft quota and the hard
limit; the room left is the smaller positive limit minus what is used. Where none answers (GPFS's mmlsquota, a site's
own tool), the row says so and the check uses the free space alone.
"""

from __future__ import annotations

import getpass
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Quota:
    tool: str
    used: int  # bytes
    limit: int  # bytes: the smaller positive of the soft quota and the hard limit

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)


def mount_of(path: Path, mounts: str | None = None) -> tuple[str, str, str]:
    """(device, mount point, file system type) of the mount that holds ``path`` (/proc/mounts' longest prefix)."""
    mounts = Path("/proc/mounts").read_text() if mounts is None else mounts
    real, best = os.path.realpath(path), ("", "/", "")
    for line in mounts.splitlines():
        device, point, kind = (line.split() + ["", "", ""])[:3]
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[1]):
            best = (device, point, kind)
    return best


def _kilobytes(field: str) -> int:
    return int(field.rstrip("*")) * 1024  # a trailing * marks a quota exceeded


def _limit(used: str, soft: str, hard: str, tool: str) -> Quota | None:
    limits = [_kilobytes(value) for value in (soft, hard) if value.rstrip("*").isdigit() and int(value.rstrip("*"))]
    return Quota(tool, _kilobytes(used), min(limits)) if limits else None


def parse_lfs(output: str) -> Quota | None:
    """`lfs quota -q -u USER MOUNT`: a row of the mount, kilobytes used, quota, limit, grace, files, ..."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1].rstrip("*").isdigit():
            return _limit(fields[1], fields[2], fields[3], "lfs quota")
    return None


def parse_quota(output: str, device: str) -> Quota | None:
    """`quota -w -u USER`: under its header, a row per file system: device, blocks (KiB), quota, limit, grace, ..."""
    for line in output.splitlines():
        fields = line.split()
        if fields and fields[0] == device and len(fields) >= 4:
            return _limit(fields[1], fields[2], fields[3], "quota")
    return None


def user_quota(path: Path, run=subprocess.run, mounts: str | None = None) -> Quota | None:
    device, point, kind = mount_of(path, mounts)
    user = getpass.getuser()
    asks = [(["quota", "-w", "-u", user], lambda out: parse_quota(out, device))]
    if kind == "lustre":
        asks.insert(0, (["lfs", "quota", "-q", "-u", user, point], parse_lfs))
    for command, parse in asks:
        try:
            done = run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        found = parse(done.stdout) if done.returncode in (0, 1) else None  # quota exits 1 over a limit
        if found:
            return found
    return None
