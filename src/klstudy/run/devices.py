"""The GPUs of one machine, shared by the jobs of a study without a scheduler: each job runs on devices of its own.

Snakemake's local execution counts resources (``--resources local_gpus=N`` keeps the GPU jobs running at once within N
GPUs) but does not say which GPU a job gets (Snakemake's issue "Handle GPU ids", open since 2020), so every job would
see every device. ``klstudy drive --gpus`` (drive.py) gives Snakemake the count and sets two variables for the jobs:
``KLSTUDY_GPUS``, the device ids to share, and ``KLSTUDY_GPU_LOCKS``, a directory. Each GPU job's command starts with

    python -m klstudy.run.devices --count N -- <the job's command>

which takes an exclusive ``flock`` on ``<locks>/gpu-<id>.lock`` for N ids that no running job holds, sets
``CUDA_VISIBLE_DEVICES`` to them and replaces itself (exec) with the job's command, which keeps the locks as open
descriptors. However the job ends (it finishes, fails, or is killed by Snakemake, Ctrl-C or SIGKILL), the kernel
closes its descriptors and the devices are free at once: nothing to clean, nothing that outlives a job, no server.
Because Snakemake never runs more GPUs' worth of jobs than there are ids, a job always finds enough free ones; one
that does not (another driver sharing the devices with another lock directory) fails, naming them.

Without ``KLSTUDY_GPUS`` (under SLURM, which sets ``CUDA_VISIBLE_DEVICES`` itself, or on a CPU) the command runs as
it is. Rendezvous ports are accelerate's: ``--main_process_port 0`` picks a free one per launch (workflow/rules).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from pathlib import Path

GPUS_ENV = "KLSTUDY_GPUS"
LOCKS_ENV = "KLSTUDY_GPU_LOCKS"


SIMULATED_ENV = "KLSTUDY_SIMULATED_GPUS"  # set: the job's GPUs are simulated (the local SLURM's empty files)


def require_cuda(env=os.environ) -> None:
    """A job given GPUs (CUDA_VISIBLE_DEVICES names some, from devices.py or SLURM, or SLURM_GPUS_ON_NODE counts some)
    whose torch sees no CUDA device fails now, naming why, instead of training on the CPU until its time limit;
    unless SIMULATED_ENV is set, as it is where the GPUs are simulated (the local SLURM's, a rehearsal on a CPU)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    counted = env.get("SLURM_GPUS_ON_NODE", "").strip()
    given = [f"CUDA_VISIBLE_DEVICES={visible}"] if visible not in ("", "NoDevFiles", "-1") else []
    given += [f"SLURM_GPUS_ON_NODE={counted}"] if counted not in ("", "0") else []
    if not given or env.get(SIMULATED_ENV):
        return
    import torch

    if torch.cuda.is_available():
        return
    cuda = torch.version.cuda
    build = f"torch {torch.__version__} ({f'built for CUDA {cuda}' if cuda else 'a CPU build'})"
    raise SystemExit(
        f"this job was given GPUs ({', '.join(given)}) but {build} sees no CUDA device: a CPU build of torch in "
        "the job's environment, or a node whose driver does not answer (nvidia-smi there); it would train on the "
        f"CPU until its time limit. {SIMULATED_ENV}=1 allows that, where the GPUs are simulated"
    )


def parse_ids(text: str, source: str = GPUS_ENV) -> list[str]:
    """``"0,1,3"`` -> ``["0", "1", "3"]``: device ids as CUDA_VISIBLE_DEVICES names them; ``source`` for errors."""
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source} {text!r} names a device twice")
    return ids


def claim(count: int, ids: list[str], locks: Path) -> tuple[list[str], list[int]]:
    """Lock ``count`` of ``ids`` that no live process holds: the ids and the (inheritable) lock descriptors."""
    if count > len(ids):
        raise SystemExit(
            f"klstudy.run.devices: the job needs {count} GPUs, {GPUS_ENV} has {len(ids)} ({','.join(ids)})"
        )
    locks.mkdir(parents=True, exist_ok=True)
    claimed, fds = [], []
    for device in ids:
        fd = os.open(locks / f"gpu-{device}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.set_inheritable(fd, True)  # kept across exec: the job itself holds the claim
        claimed.append(device)
        fds.append(fd)
        if len(claimed) == count:
            return claimed, fds
    for fd in fds:  # not enough: take none
        os.close(fd)
    raise SystemExit(
        f"klstudy.run.devices: {count} free GPUs wanted, {len(claimed)} of {','.join(ids)} free in {locks}: is another "
        "study using them with other locks, or Snakemake's --resources local_gpus above the number of devices?"
    )


def allocated_processes(expected: int, env=os.environ) -> int:
    """The training processes a job starts: one per GPU SLURM gave it (SLURM_GPUS_ON_NODE × SLURM_JOB_NUM_NODES; in a
    SLURM job without SLURM_GPUS_ON_NODE, the devices CUDA_VISIBLE_DEVICES names), or ``expected`` (the config's GPUs
    × nodes) without an allocation. A different allocation is an error, not a smaller launch: the config's batch
    layout was checked for ``expected`` processes."""
    per_node, nodes = env.get("SLURM_GPUS_ON_NODE"), env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if not per_node and env.get("SLURM_JOB_ID") and env.get("CUDA_VISIBLE_DEVICES"):
        per_node = str(len(parse_ids(env["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES")))
    if not per_node:
        return expected
    got = int(per_node) * int(nodes or 1)
    if got != expected:
        raise SystemExit(
            f"klstudy.run.devices: SLURM gave this job {per_node} GPUs on each of {nodes or 1} nodes "
            f"({got} processes), "
            f"the config's resources.train asks for {expected}: resubmit it with the config's gres and nodes"
        )
    return got


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m klstudy.run.devices", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, help="GPUs the job needs")
    parser.add_argument(
        "--processes", type=int, help="print the processes to launch for this many GPUs (allocated_processes)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's command")
    args = parser.parse_args(argv)
    if args.processes is not None:
        print(allocated_processes(args.processes))
        return
    if args.count is None:
        parser.error("give --count or --processes")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the job's command after --")
    if os.environ.get(GPUS_ENV) and args.count > 0:
        devices, _ = claim(args.count, parse_ids(os.environ[GPUS_ENV]), Path(os.environ[LOCKS_ENV]))
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        print(f"klstudy.run.devices: GPUs {','.join(devices)} (pid {os.getpid()})", file=sys.stderr, flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
