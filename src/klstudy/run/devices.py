"""A job's devices: its GPUs checked (require_cuda) and its CPU threads (threads); and on one machine without a
scheduler, GPUs of its own.

That last is home-made: Snakemake's ``--resources local_gpus=N`` keeps the GPU jobs within N GPUs but says no job
which (Snakemake's issue "Handle GPU ids", open since 2020). ``klstudy drive --gpus`` sets ``KLSTUDY_GPUS`` (the ids)
and ``KLSTUDY_GPU_LOCKS`` (a directory), and only then does each GPU job's command start with
``python -m klstudy.run.devices --count N -- <command>``, which takes an exclusive ``flock`` on
``<locks>/gpu-<id>.lock`` for N ids no running job holds, sets ``CUDA_VISIBLE_DEVICES`` and execs the command, which
keeps the locks: however the job ends, the kernel frees them. Under SLURM, gres gives each job its own GPUs and no
command is wrapped.
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


def threads(count: int | None, env=os.environ) -> None:
    """torch's threads: the job's CPUs shared by the processes `accelerate launch` started on this node (8 ranks of a
    64-CPU job take 8 each, not 64). First, a job given GPUs that sees none fails (require_cuda)."""
    import torch

    require_cuda(env)
    if count:
        torch.set_num_threads(threads_per_process(count, env))


def threads_per_process(cpus: int, env=os.environ) -> int:
    return max(1, cpus // int(env.get("LOCAL_WORLD_SIZE") or 1))  # LOCAL_WORLD_SIZE: accelerate's, 1 outside it


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m klstudy.run.devices", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, help="GPUs the job needs")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.count is None or not command or not os.environ.get(GPUS_ENV):
        parser.error(f"give --count N -- the job's command, with {GPUS_ENV} set (klstudy drive --gpus)")
    devices, _ = claim(args.count, parse_ids(os.environ[GPUS_ENV]), Path(os.environ[LOCKS_ENV]))
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    print(f"klstudy.run.devices: GPUs {','.join(devices)} (pid {os.getpid()})", file=sys.stderr, flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
