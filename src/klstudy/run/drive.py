"""The study's driver: `make study` runs Snakemake under it, so that an interrupted study resumes with `make study`.

    klstudy drive [--warm] [--gpus IDS] -- snakemake --cores all --keep-going --rerun-incomplete

A plain `snakemake` stopped by Ctrl-C, SIGTERM or SIGKILL leaves what the next run refuses; the driver meets each with
the kernel's or Snakemake's own mechanism:

- Snakemake's lock outlives a Snakemake killed before it could release it. The driver holds a kernel ``flock`` on
  ``.snakemake/klstudy-driver.lock`` and passes it to Snakemake, so the kernel drops it when both are gone; a driver
  that gets it knows Snakemake locks found then are stale, and releases them (``snakemake --unlock``).
- Interrupted jobs' outputs are incomplete: ``--rerun-incomplete`` reruns them; a cell resumes from its checkpoint.
- Jobs orphaned by a Snakemake killed with SIGKILL: Snakemake runs in a process group of its own, which the driver
  kills once Snakemake has exited.
- Ctrl-C reaches Snakemake's group as from a terminal, SIGTERM Snakemake alone (it finishes its running jobs); the
  driver waits for it (``subprocess.call`` would SIGKILL it first, leaving its lock). A driver killed with SIGKILL
  sends its Snakemake and warm server SIGTERM (``PR_SET_PDEATHSIG``).

``--warm``: jobs run in a warm server (warm.py); ``--gpus``: each GPU job on devices of its own (devices.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from klstudy.run import devices

LOCK = Path(".snakemake") / "klstudy-driver.lock"
SNAKEMAKE_LOCKS = Path(".snakemake") / "locks"
GPU_LOCKS = Path(".snakemake") / "klstudy-gpus"
_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM):
    """A ``preexec_fn``: the child gets ``signum`` when the process that started it dies (Linux), and takes Ctrl-C
    (SIGINT) as Python does by default even where the driver was started with it ignored (``nohup cmd &``): the
    driver forwards SIGINT on purpose."""
    parent = os.getpid()

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signum)

    return preexec


def take_lock() -> int:
    """The driver's flock on LOCK (waiting for another driver in this directory to end); its file descriptor."""
    LOCK.parent.mkdir(exist_ok=True)
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"klstudy drive: another study runs in this directory ({LOCK} is held); waiting for it", file=sys.stderr)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def release_stale_locks(command: list[str]) -> None:
    """Under the driver's flock, Snakemake locks left here belong to a Snakemake that is dead: release them."""
    if SNAKEMAKE_LOCKS.is_dir() and any(SNAKEMAKE_LOCKS.iterdir()):
        print("klstudy drive: releasing the lock of an interrupted Snakemake (snakemake --unlock)", file=sys.stderr)
        subprocess.run([*command, "--unlock"], check=True, stdout=subprocess.DEVNULL)


def supervise(command: list[str], env: dict, lock_fd: int) -> int:
    """Run ``command`` in a process group of its own, forward Ctrl-C and SIGTERM, and when it has exited kill what is
    left of its group (jobs it orphaned); its exit status (negative: the signal that ended it)."""
    snakemake = subprocess.Popen(
        command, env=env, process_group=0, pass_fds=(lock_fd,), preexec_fn=die_with_parent(signal.SIGTERM)
    )

    def forward(signum, frame):
        if signum == signal.SIGINT:  # as a terminal's Ctrl-C: Snakemake and its jobs
            _signal_group(snakemake.pid, signal.SIGINT)
        else:  # Snakemake's graceful stop: no new jobs, running ones finish
            snakemake.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        os.waitid(os.P_PID, snakemake.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its group id is ours still
        _signal_group(snakemake.pid, signal.SIGKILL)
        return snakemake.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # nobody left in the group
        os.killpg(pgid, signum)


def visible_gpus(spec: str) -> list[str]:
    """``--gpus``: ids (``0,1,3``), ``all`` or ``auto``: the devices CUDA_VISIBLE_DEVICES names where it is set (an
    empty value hides them all), else every GPU ``nvidia-smi`` lists. Without nvidia-smi, ``all`` is an error and
    ``auto`` (``make study``'s default) means no GPU to share: a CPU machine."""
    if spec not in ("all", "auto"):
        if not (ids := devices.parse_ids(spec, "--gpus")):
            raise SystemExit("klstudy drive: --gpus names no device")
        return ids
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return devices.parse_ids(os.environ["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES")
    if not shutil.which("nvidia-smi"):
        if spec == "auto":
            return []
        raise SystemExit("klstudy drive: --gpus all, but no nvidia-smi here to list them: name them, e.g. --gpus 0,1")
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, check=True
    )
    return devices.parse_ids(",".join(listed.stdout.split()), "nvidia-smi")


def with_gpus(command: list[str], env: dict, ids: list[str]) -> list[str]:
    """The Snakemake command and environment under which each GPU job claims its own of ``ids`` (devices.py)."""
    env.update({devices.GPUS_ENV: ",".join(ids), devices.LOCKS_ENV: str(GPU_LOCKS.resolve())})
    print(f"klstudy drive: GPUs {','.join(ids)}, each job on its own", file=sys.stderr)
    return [*command, "--resources", f"local_gpus={len(ids)}"]


def drive(command: list[str], warm_log: Path | None = None, gpus: str | None = None) -> int:
    """Run a Snakemake command so that it can be interrupted at any moment and run again; with ``warm_log``, every
    klstudy job it starts runs in a warm server (warm.py) whose output goes there; with ``gpus`` (``--gpus``), every
    GPU job on devices of its own. The command's exit status."""
    lock_fd = take_lock()
    try:
        release_stale_locks(command)
        env = dict(os.environ)
        if gpus and (ids := visible_gpus(gpus)):
            command = with_gpus(command, env, ids)
        if warm_log is None:
            return supervise(command, env, lock_fd)
        from klstudy.run import warm

        with warm.server(warm_log, env=env, preexec_fn=die_with_parent(signal.SIGTERM)) as warm_env:
            return supervise(command, warm_env, lock_fd)
    finally:
        os.close(lock_fd)
