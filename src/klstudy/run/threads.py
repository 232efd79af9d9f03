"""A job's torch threads: its CPUs shared by the processes `accelerate launch` started on its node."""

from __future__ import annotations

import os


def threads(count: int | None) -> None:
    """The job's CPUs shared by the processes `accelerate launch` started on this node (LOCAL_WORLD_SIZE): 8 ranks
    of a 64-CPU job take 8 threads each, not 64. A job given GPUs that sees none fails here (devices.require_cuda)."""
    import torch

    from klstudy.run.devices import require_cuda

    require_cuda()
    if count:
        torch.set_num_threads(threads_per_process(count))


def local_processes(env=os.environ) -> int:
    """Processes `accelerate launch` started on this node (1 outside a launch)."""
    return int(env.get("LOCAL_WORLD_SIZE") or 1)


def threads_per_process(cpus: int, env=os.environ) -> int:
    return max(1, cpus // local_processes(env))
