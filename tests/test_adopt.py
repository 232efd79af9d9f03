"""A driver's adoption of the jobs an earlier driver left (klstudy.run.adopt), against a scripted queue.

The whole path, a driver at its time limit whose successor adopts two training cells, runs under a real SLURM in
test_slurm.py; here each step's decision: which jobs are Snakemake's, which are cancelled, waited for, kept.
"""

import base64
import json
import subprocess
from types import SimpleNamespace

from klstudy.run import adopt

RUN = "klstudy_0b6f4a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def queue_line(job, state, workdir, name=RUN, comment="rule_train_rl_wildcards_onpolicy_tiny_k1-reward_0.1_0"):
    return f"{job}|{state}|{name}|{workdir}|{comment}"


class Cluster:
    """squeue answers one scripted queue per look; sacct a final state per job; scancel is recorded."""

    def __init__(self, looks, states):
        self.looks, self.states, self.cancelled = list(looks), states, []

    def __call__(self, command, **_):
        if command[0] == "squeue":
            lines = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
            return SimpleNamespace(stdout="\n".join(lines) + "\n", returncode=0)
        if command[0] == "sacct":
            return SimpleNamespace(stdout=self.states.get(command[command.index("-j") + 1], "") + "\n", returncode=0)
        if command[0] == "scancel":
            self.cancelled += command[1:]
            return SimpleNamespace(returncode=0)
        raise AssertionError(command)


def test_only_snakemakes_jobs_from_this_directory_are_found(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    lines = [
        queue_line("1", "RUNNING", tmp_path),
        queue_line("2", "RUNNING", other),  # another clone's
        queue_line("3", "RUNNING", tmp_path, name="interactive"),  # a job submitted by hand
        queue_line("4", "PENDING", tmp_path, comment="my own"),
        queue_line("5", "RUNNING", tmp_path, name="klstudy-driver", comment=""),  # this driver
    ]
    found = adopt.left_jobs(tmp_path, me="5", run=Cluster([lines], {}))
    assert [job.id for job in found] == ["1"]


def _marker(workdir, output, job):
    path = workdir / ".snakemake" / "incomplete" / base64.urlsafe_b64encode(output.encode()).decode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"external_jobid": job}))
    return path


def test_running_jobs_are_waited_for_pending_ones_cancelled_and_completed_outputs_kept(tmp_path):
    looks = [
        [queue_line("11", "RUNNING", tmp_path), queue_line("12", "RUNNING", tmp_path),
         queue_line("13", "PENDING", tmp_path)],
        [queue_line("11", "RUNNING", tmp_path), queue_line("12", "PENDING", tmp_path)],  # 12 requeued: a slice's end
        [],
    ]  # fmt: skip
    cluster = Cluster(looks, {"11": "COMPLETED", "12": "CANCELLED by 0", "13": "CANCELLED by 0"})
    kept = _marker(tmp_path, "results/runs/a/summary.json", "11")
    rerun = _marker(tmp_path, "results/runs/b/summary.json", "12")
    said, slept = [], []
    adopt.adopt(tmp_path, me="9", poll=7, run=cluster, sleep=slept.append, say=said.append)
    assert cluster.cancelled == ["13", "12"] and slept == [7, 7]
    assert not kept.exists() and rerun.exists()  # Snakemake keeps 11's output and runs 12's job again
    text = "\n".join(said)
    assert text.count("still runs: waiting for it, untouched") == 2
    assert "job 11 completed results/runs/a/summary.json: kept" in text
    assert "job 12 (rule_train_rl" in text and "did not complete: Snakemake runs it again" in text


def test_a_long_output_name_is_read_back_from_its_split_marker(tmp_path):
    output = "results/" + "x" * 400 + "/summary.json"
    b64 = base64.urlsafe_b64encode(output.encode()).decode()
    chunks = [b64[i : i + 254] for i in range(0, len(b64), 254)]  # as Snakemake's FilePersistence splits a name
    path = tmp_path.joinpath(".snakemake", "incomplete", *("@" + chunk for chunk in chunks[:-1]), chunks[-1])
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"external_jobid": "5"}))
    assert adopt.markers(tmp_path) == {path: "5"} and adopt.output_of(path, tmp_path) == output


def test_the_driver_script_adopts_and_resubmits_itself_at_its_limit():
    from workflow_helpers import ROOT

    script = (ROOT / "slurm" / "driver.sbatch").read_text()
    assert "-m klstudy adopt" in script and "--dependency=afterany" in script and "#SBATCH --time=1-00:00:00" in script
    assert subprocess.run(["bash", "-n", str(ROOT / "slurm" / "driver.sbatch")]).returncode == 0
