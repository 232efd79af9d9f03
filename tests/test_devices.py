"""One machine's GPUs shared by a study's jobs without a scheduler (devices.py, `klstudy drive --gpus`).

With simulated devices (ids and no CUDA), Snakemake runs more jobs than devices; each job records what it saw.
Every job gets the number of devices it asks for, jobs that overlap in time never share one, a job killed with
SIGKILL frees its devices for the next at once, and two concurrent two-process cells (gloo) rendezvous at ports of
their own and both end `ok`.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from workflow_helpers import ROOT, SNAKEMAKE, claims_it_can_test, reduced_config, snakemake

from klstudy.run import devices

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

# A job that records the devices it was given and when it held them; the first two wait for each other (an event,
# with a time-out), so that the test knows two jobs ran at once; a job listed in KILLED kills itself with SIGKILL.
RECORD = textwrap.dedent("""
    import json, os, signal, sys, time
    out, index, killed = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    folder = os.path.dirname(out)
    start = time.time()
    seen = {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start}
    with open(os.path.join(folder, f"{index}.start"), "w") as f:
        json.dump(seen, f)
    if str(index) in killed:
        os.kill(os.getpid(), signal.SIGKILL)
    while len([n for n in os.listdir(folder) if n.endswith(".start")]) < 2 and time.time() < start + 60:
        time.sleep(0.05)
    time.sleep(0.5)
    seen["end"] = time.time()
    with open(out, "w") as f:
        json.dump(seen, f)
""")

# Job 0 runs first (its priority), so that when it is the one killed, the others come after it.
SNAKEFILE = """
rule all:
    input: expand("out/{{i}}.json", i=range({jobs}))

rule first:
    output: "out/0.json"
    priority: 100
    resources: local_gpus={per_job}
    shell: "{python} -m klstudy.run.devices --count {per_job} -- {python} {record} {{output}} 0 {killed}"

rule job:
    output: "out/{{i}}.json"
    wildcard_constraints: i="[1-9][0-9]*"
    resources: local_gpus={per_job}
    shell: "{python} -m klstudy.run.devices --count {per_job} -- {python} {record} {{output}} {{wildcards.i}} {killed}"
"""


def run_jobs(tmp_path: Path, gpus: str, jobs: int, per_job: int, killed: str = "-") -> subprocess.CompletedProcess:
    (tmp_path / "record.py").write_text(RECORD)
    (tmp_path / "Snakefile").write_text(
        SNAKEFILE.format(
            jobs=jobs, per_job=per_job, python=sys.executable, record=tmp_path / "record.py", killed=killed
        )
    )
    command = [sys.executable, "-m", "klstudy", "drive", "--gpus", gpus, "--", SNAKEMAKE, "--cores", str(jobs),
               "--keep-going"]  # fmt: skip
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def records(tmp_path: Path) -> dict[int, dict]:
    seen = {}
    for path in (tmp_path / "out").glob("*.start"):
        seen[int(path.stem)] = json.loads(path.read_text())
        done = tmp_path / "out" / f"{path.stem}.json"
        if done.exists():
            seen[int(path.stem)] = json.loads(done.read_text())
    return seen


def test_concurrent_jobs_get_their_own_devices(tmp_path):
    run = run_jobs(tmp_path, "0,1,2,3", jobs=6, per_job=2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    seen = records(tmp_path)
    assert len(seen) == 6 and all(len(s["devices"].split(",")) == 2 for s in seen.values()), seen
    assert set(",".join(s["devices"] for s in seen.values()).split(",")) <= {"0", "1", "2", "3"}
    overlapping = 0
    for a, b in itertools.combinations(seen.values(), 2):
        if a["start"] < b["end"] and b["start"] < a["end"]:  # ran at the same time
            overlapping += 1
            assert not set(a["devices"].split(",")) & set(b["devices"].split(",")), (a, b)
    assert overlapping >= 1, "no two jobs ran at once: the test shows nothing"
    times = sorted(t for s in seen.values() for t in (s["start"], s["end"]))
    most = max(sum(s["start"] <= t < s["end"] for s in seen.values()) for t in times)
    assert most <= 2, "Snakemake ran more GPUs' worth of jobs than there are devices"


def test_a_job_killed_with_sigkill_frees_its_devices_at_once(tmp_path):
    """Two devices, two per job: the jobs run one after the other, so each later job needs the killed job's."""
    run = run_jobs(tmp_path, "0,1", jobs=3, per_job=2, killed="0")
    assert run.returncode != 0  # job 0 failed, with --keep-going the others ran
    seen = records(tmp_path)
    assert seen[0]["devices"] == "0,1" and "end" not in seen[0]
    assert [seen[i]["devices"] for i in (1, 2)] == ["0,1", "0,1"] and all("end" in seen[i] for i in (1, 2)), seen
    assert min(seen[i]["start"] for i in (1, 2)) > seen[0]["start"], "the killed job ran first, holding both"


def test_a_claim_names_the_devices_it_could_not_get(tmp_path, monkeypatch):
    first, fds = devices.claim(2, ["0", "1", "2"], tmp_path)
    assert first == ["0", "1"]
    with pytest.raises(SystemExit, match="2 free GPUs wanted, 1 of 0,1,2 free"):
        devices.claim(2, ["0", "1", "2"], tmp_path)  # this process holds 0 and 1 (flock is per open file)
    with pytest.raises(SystemExit, match="needs 4 GPUs"):
        devices.claim(4, ["0", "1", "2"], tmp_path)
    for fd in fds:
        os.close(fd)
    assert devices.claim(3, ["0", "1", "2"], tmp_path)[0] == ["0", "1", "2"]  # closed: free again
    with pytest.raises(ValueError, match="twice"):
        devices.parse_ids("0,1,0")


def test_gpu_jobs_claim_devices_only_under_drive_gpus(tmp_path, monkeypatch):
    """The paper's training and evaluation commands start with the claim where `drive --gpus` set KLSTUDY_GPUS, and
    run unwrapped elsewhere (under SLURM, gres gives each job its own GPUs)."""
    cell = "results/runs/onpolicy/qwen2.5-7b/k1-reward/beta~0.1/seed~0"
    targets = [f"{cell}/summary.json", f"{cell.replace('runs', 'evals')}/math500.json"]
    paper = ("-n", "-p", "--cores", "1", "--configfile", str(ROOT / "config/paper.yaml"))
    monkeypatch.delenv(devices.GPUS_ENV, raising=False)
    assert "klstudy.run.devices" not in snakemake(*targets, *paper, cwd=tmp_path)
    monkeypatch.setenv(devices.GPUS_ENV, "0,1,2,3,4,5,6,7")
    out = snakemake(*targets, *paper, cwd=tmp_path)
    assert "-m klstudy.run.devices --count 8 --" in out and "-m klstudy.run.devices --count 1 --" in out


TWO_PROCESSES = "config/accelerate/cpu-2proc.yaml"


@pytest.mark.slow  # 40-55 s: `make test-all` (CI's time)
def test_two_concurrent_two_process_cells_rendezvous_at_ports_of_their_own(tmp_path):
    """Two cells of two gloo processes each, on four simulated GPUs, through the workflow: they run at once, each
    on two devices of its own, at a port of its own (their summary.json's `launch`), and both end ok."""
    config = reduced_config()
    study = config["studies"]["onpolicy"]
    study["train"].update(steps=3, accelerate_config=TWO_PROCESSES, eval_every=3, checkpoint_every=3)
    config["studies"] = {"onpolicy": study}
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="onpolicy", kl=["k1-reward"], steps=[0])
    config["figures"] = {}
    config["resources"]["train"]["gpus"] = 2
    config["claims"] = claims_it_can_test(config)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cells = [f"results/runs/onpolicy/tiny/{kl}/seed~0/summary.json" for kl in ("none/beta~0", "k1-reward/beta~0.1")]
    command = [sys.executable, "-m", "klstudy", "drive", "--gpus", "0,1,2,3", "--", SNAKEMAKE, *cells,
               "--snakefile", str(ROOT / "Snakefile"), "--configfile", "config.yaml", "--cores", "4"]  # fmt: skip
    simulated = {**os.environ, devices.SIMULATED_ENV: "1"}  # the ids name no device: the cells train on the CPU
    run = subprocess.run(command, cwd=tmp_path, env=simulated, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summaries = [json.loads((tmp_path / cell).read_text()) for cell in cells]
    launches = [s["launch"] for s in summaries]
    assert [s["status"] for s in summaries] == ["ok", "ok"], summaries
    assert all(launch["processes"] == 2 and len(launch["devices"].split(",")) == 2 for launch in launches), launches
    # Disjoint devices also show that the cells ran at once: a claim takes the lowest free ids, so a cell that started
    # after the other had ended would have had 0,1 too.
    assert not set(launches[0]["devices"].split(",")) & set(launches[1]["devices"].split(",")), launches
    assert launches[0]["rendezvous_port"] != launches[1]["rendezvous_port"], launches


def test_which_devices_drive_shares(monkeypatch):
    from klstudy.run import drive

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert drive.visible_gpus("auto") == drive.visible_gpus("all") == ["2", "3"]
    assert drive.visible_gpus("0,1") == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # set and empty: every device hidden
    assert drive.visible_gpus("auto") == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: a CPU machine
    assert drive.visible_gpus("auto") == []
    with pytest.raises(SystemExit, match="no nvidia-smi"):
        drive.visible_gpus("all")
    with pytest.raises(SystemExit, match="names no device"):
        drive.visible_gpus(",")


def test_a_job_given_gpus_that_sees_none_fails_at_once_naming_why(monkeypatch):
    """On this CPU torch sees no CUDA device: a job that was given some (SLURM's CUDA_VISIBLE_DEVICES) stops, unless
    its GPUs are simulated; a job given none runs on."""
    for none in ({}, {"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, {"SLURM_GPUS_ON_NODE": "0"}):
        devices.require_cuda(none)
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    with pytest.raises(SystemExit, match=r"given GPUs \(CUDA_VISIBLE_DEVICES=0,1\) but torch .* sees no CUDA device"):
        devices.require_cuda({"CUDA_VISIBLE_DEVICES": "0,1"})
    with pytest.raises(SystemExit, match=r"given GPUs \(SLURM_GPUS_ON_NODE=2\)"):
        devices.require_cuda({"SLURM_GPUS_ON_NODE": "2"})
    devices.require_cuda({"CUDA_VISIBLE_DEVICES": "0,1", devices.SIMULATED_ENV: "1"})
    stage = subprocess.run([sys.executable, "-m", "klstudy", "train", "--settings", "{}", "--model", "m",
                            "--train-data", "t", "--heldout-data", "h", "--out", "o", "--checkpoints", "c"],
                           env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"}, capture_output=True, text=True)  # fmt: skip
    assert stage.returncode == 1 and "sees no CUDA device" in stage.stderr, stage.stderr[-2000:]
