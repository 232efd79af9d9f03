"""The preflight's CUDA rows: torch's CUDA in each environment of the run's GPU jobs (this one, and `vllm_python` where
a job runs vLLM) against the CUDA that this node's driver supports (nvidia-smi); skipped without nvidia-smi (a login
node: run the preflight on a GPU node through srun). Tested in tests/test_preflight.py on real nvidia-smi outputs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from klstudy.config import REPO_ROOT, train_gpus
from klstudy.run.check import FAIL, OK, SKIP, WARN, Check

# nvidia-smi's header: "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0   |". The CUDA
# version is the newest runtime the driver supports; a torch wheel names the runtime it was built with.
DRIVER_LINE = re.compile(r"Driver Version:\s*(?P<driver>[\d.]+)\s+CUDA Version:\s*(?P<cuda>\d+\.\d+)")
NEW_DRIVER = "a GPU node (or partition) whose driver supports CUDA {}, or torch built for the driver's CUDA there"


def cuda_check(where: str, smi: str, torch_version: str, wheel_cuda: str | None) -> Check:
    """The driver's CUDA (``smi``: nvidia-smi's output) against torch.version.cuda of the environment ``where`` (None:
    a CPU build). A driver of an older CUDA major cannot run the wheel; an older minor of the same major runs it under
    CUDA's minor-version compatibility, short of what needs the newer driver (PTX the newer toolkit wrote)."""
    what, wheel = f"CUDA driver: {where}", f"torch {torch_version} is built for CUDA {wheel_cuda}"
    if wheel_cuda is None:
        return Check(what, FAIL, f"torch {torch_version} is a CPU build: the run's GPU jobs would see no GPU",
                     "the environment's CUDA build of torch (`make venv` / `make vllm-env VLLM_FLAVOUR=gpu` without a "
                     "CPU wheel in PIP_FIND_LINKS)")  # fmt: skip
    if not (found := DRIVER_LINE.search(smi)):
        first = next((line.strip() for line in smi.splitlines() if line.strip()), "nothing")
        return Check(what, FAIL, f"{wheel}; nvidia-smi names no CUDA version: {first}",
                     "a node whose NVIDIA driver answers nvidia-smi")  # fmt: skip
    detail = f"{wheel}; this node's driver {found['driver']} supports CUDA {found['cuda']}"
    needed, supported = (tuple(int(n) for n in v.split(".")[:2]) for v in (wheel_cuda, found["cuda"]))
    if needed[0] > supported[0]:
        return Check(what, FAIL, f"{detail}: too old, CUDA cannot start", NEW_DRIVER.format(wheel_cuda))
    if needed > supported:
        return Check(what, WARN, f"{detail}: runs under CUDA's minor-version compatibility, not what needs the newer "
                                 "driver", NEW_DRIVER.format(wheel_cuda))  # fmt: skip
    return Check(what, OK, detail)


def gpu_environments(config: dict, root: Path = REPO_ROOT) -> dict[str, Path]:
    """The interpreters of the run's GPU jobs (workflow/rules/common.smk's stage_python): this one, and `vllm_python`
    where a job runs vLLM; none if no job asks for a GPU."""
    asked = [spec["gpus"] for spec in config["resources"].values()] + [train_gpus(config, s) for s in config["studies"]]
    vllm = config["evaluation"]["backend"] == "vllm" or any(
        spec["train"]["generation"] == "vllm" for spec in config["studies"].values()
    )
    found = {"this environment": Path(sys.executable)} | ({"vllm_python": root / config["vllm_python"]} if vllm else {})
    return found if any(asked) else {}


def cuda_checks(config: dict, root: Path = REPO_ROOT, run=subprocess.run) -> list[Check]:
    """One row per environment of the run's GPU jobs: its torch's CUDA against this node's driver (cuda_check)."""
    if not (environments := gpu_environments(config, root)):
        return [Check("CUDA driver", SKIP, "no job of this run asks for a GPU")]
    if not shutil.which("nvidia-smi"):
        return [Check("CUDA driver", SKIP, "no nvidia-smi here (a login node?): not compared with torch's CUDA; "
                      "`srun --gres=gpu:1 … klstudy preflight` on a GPU node compares them")]  # fmt: skip
    try:
        done = run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
        smi = done.stdout + done.stderr
    except (OSError, subprocess.SubprocessError) as error:  # a hung or broken driver: cuda_check's FAIL row
        smi = f"nvidia-smi failed: {error}"
    rows, probe = [], "import torch; print(torch.__version__); print(torch.version.cuda)"
    for where, python in environments.items():
        label = f"{where} ({python})"
        try:
            done = run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
            if done.returncode:
                raise OSError((done.stderr.strip().splitlines() or ["no output"])[-1])
            version, wheel_cuda = done.stdout.split()[-2:]
            rows.append(cuda_check(label, smi, version, None if wheel_cuda == "None" else wheel_cuda))
        except (OSError, subprocess.SubprocessError) as error:
            remedy = "make vllm-env VLLM_FLAVOUR=gpu" if where == "vllm_python" else "make venv"
            rows.append(Check(f"CUDA driver: {label}", FAIL, f"torch cannot be read there: {error}", remedy))
    return rows
