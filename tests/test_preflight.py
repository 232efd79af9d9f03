"""`klstudy preflight` without a cluster or a network: the hub's client replaced by one that raises each of
huggingface_hub's real exceptions, the cluster's `sinfo` by its text, and the estimates against docs/cost.md's
numbers. tests/test_slurm.py runs the SLURM rows against a real local SLURM."""

import subprocess
from pathlib import Path

import httpx2
import pytest
import yaml
from huggingface_hub import errors
from workflow_helpers import ROOT

from klstudy.config import RUN_DIR, ConfigError, all_cells, train_gpus, validate_config
from klstudy.run import cuda, estimate, memory_plans, preflight


def paper(**cluster) -> dict:
    config = validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))
    config["cluster"].update(cluster)
    return config


def response(status: int) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/models/x"))


# Each of the hub's errors, built as huggingface_hub builds them, and the words its row must say.
HUB_ERRORS = {
    "gated": (errors.GatedRepoError("403 gated", response=response(403)), "gated", "accept the licence at"),
    "missing": (errors.RepositoryNotFoundError("404", response=response(404)), "not found", "check the hub_id"),
    "revision": (errors.RevisionNotFoundError("404", response=response(404)), "revision 'v9' not found", "branch"),
    "bad token": (errors.HfHubHTTPError("401", response=response(401)), "401: the token is invalid", "new token"),
    "server": (errors.HfHubHTTPError("503 busy", response=response(503)), "HTTP 503", "retry later"),
    "offline": (errors.OfflineModeIsEnabled("offline"), "HF_HUB_OFFLINE=1", "unset HF_HUB_OFFLINE"),
    "not cached": (errors.LocalEntryNotFoundError("no cache"), "not in the local cache", "set local_dir"),
    "no network": (ConnectionError("refused"), "hub unreachable (ConnectionError)", "set local_dir"),
}


class FakeHub:
    """HfApi's two calls the preflight makes; ``failing`` raises ``error`` for one repository."""

    def __init__(self, failing: str, error: Exception):
        self.failing, self.error, self.asked = failing, error, []

    def auth_check(self, repo_id, repo_type=None):
        self.asked.append((repo_id, repo_type))
        if repo_id == self.failing and not isinstance(self.error, errors.RevisionNotFoundError):
            raise self.error

    def repo_info(self, repo_id, repo_type=None, revision=None):
        if repo_id == self.failing:
            raise self.error


@pytest.mark.parametrize("case", HUB_ERRORS)
def test_each_hub_error_is_a_failing_row_with_its_sentence(case, tmp_path):
    error, detail, remedy = HUB_ERRORS[case]
    config = paper()
    config["models"]["llama-3.1-8b-instruct"]["revision"] = "v9"  # asked with repo_info
    hub = FakeHub("meta-llama/Llama-3.1-8B-Instruct", error)
    rows = {row.what: row for row in preflight.hub_checks(config, tmp_path, hub)}
    row = rows["models.llama-3.1-8b-instruct (meta-llama/Llama-3.1-8B-Instruct)"]
    assert row.status == preflight.FAIL and detail in row.detail and remedy in row.remedy, row
    assert rows["models.qwen2.5-7b (Qwen/Qwen2.5-7B)"].status == preflight.OK
    # Every hub repository of the paper is asked once, datasets as datasets, MATH²'s public copy among them.
    assert ("cais/mmlu", "dataset") in hub.asked and ("veds12/math-squared", "dataset") in hub.asked
    passed, text = preflight.report(config, tmp_path, client=hub)
    assert not passed and remedy in text and "preflight: " in text


def test_offline_the_hub_is_not_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (row,) = preflight.hub_checks(paper(), tmp_path, hub := FakeHub("", None))
    assert row.status == preflight.SKIP and "from the cache" in row.detail and not hub.asked


def test_staged_or_local_copies_are_not_asked_of_the_hub(tmp_path):
    config = paper()
    (tmp_path / "results/models/qwen2.5-7b").mkdir(parents=True)
    config["models"]["llama-3.1-8b-instruct"]["local_dir"] = str(tmp_path)
    repos = [repo for _, repo, _, _ in preflight.hub_repos(config, tmp_path)]
    assert "Qwen/Qwen2.5-7B" not in repos and "meta-llama/Llama-3.1-8B-Instruct" not in repos
    assert "Qwen/Qwen3-4B-Instruct-2507" in repos


def test_math_squared_is_staged_from_the_hub_or_a_named_copy(tmp_path):
    rows = {row.what: row for row in preflight.source_checks(paper(), tmp_path)}
    row = rows["evaluation task math_squared"]
    assert row.status == preflight.OK and row.detail == "veds12/math-squared"
    assert rows["evaluation task math500"].status == preflight.OK
    config = paper()
    config["data"]["math_squared"]["local_dir"] = str(tmp_path / "nowhere")
    rows = {row.what: row for row in preflight.source_checks(config, tmp_path)}
    assert rows["evaluation task math_squared"].status == preflight.OK
    assert rows["data.math_squared.local_dir"].status == preflight.FAIL  # named, but not there


def fake_run(sinfo="", qos="", sbatch=(0, "sbatch: Job 7 to start at 2026-12-07T17:32:40 using 1 processors on nodes "
                                         "vm in partition gpu"), fails=()):  # fmt: skip
    """subprocess.run of SLURM's commands: sinfo prints ``sinfo``, sacctmgr ``qos`` (or ``sinfo`` for an association),
    sbatch answers ``sbatch`` (exit status, message on stderr; a function of the command for several); a command
    whose word is in ``fails`` exits 1 as sacctmgr does where users may not run it. Every command is kept in
    ``run.asked``."""

    def run(command, check=False, **kwargs):
        run.asked.append(command)
        if any(word in command for word in fails):
            if check:
                raise subprocess.CalledProcessError(1, command, stderr="Access/permission denied")
            return type("Done", (), {"stdout": "", "stderr": "sacctmgr: Access/permission denied", "returncode": 1})()
        if command[0] == "sbatch":
            code, said = sbatch(command) if callable(sbatch) else sbatch
            return type("Done", (), {"stdout": "", "stderr": said + "\n", "returncode": code})()
        out = qos if "qos" in command else sinfo
        return type("Done", (), {"stdout": out, "stderr": "", "returncode": 0})()

    run.asked = []
    return run


def test_each_job_is_asked_of_sbatch_as_the_slurm_plugin_submits_it():
    """common.smk's job_resources, as sbatch options: the account, partition and QOS named, the GPUs per node (the
    most any study asks, or --gpus-per-node), the constraint for GPU jobs only."""
    config = paper(account="physics", gpu_partition="gpu", cpu_partition="cpu", qos="long", constraint="h100")
    config["cluster"]["gpu_model"] = "h100"
    config["studies"]["onpolicy"]["gpus"] = 16
    assert preflight.sbatch_request(config, "train") == [
        "--account=physics", "--partition=gpu", "--qos=long", "--time=2880", "--mem=800000", "--cpus-per-task=64",
        "--nodes=1", "--ntasks=1", "--gres=gpu:h100:16", "--constraint=h100"]  # fmt: skip
    assert preflight.sbatch_request(config, "toy")[:3] == ["--account=physics", "--partition=cpu", "--qos=long"]
    assert not [arg for arg in preflight.sbatch_request(config, "toy") if "gpu" in arg or "constraint" in arg]
    config["cluster"].update(gpu_request="gpus-per-node", account=None, qos=None, constraint=None)
    assert preflight.sbatch_request(config, "evaluate") == [
        "--partition=gpu", "--time=240", "--mem=64000", "--cpus-per-task=8", "--nodes=1", "--ntasks=1",
        "--gpus-per-node=h100:1"]  # fmt: skip


REFUSED = "sbatch: error: invalid partition specified: nope\nallocation failure: Invalid partition name specified"


def test_each_job_sbatch_refuses_fails_in_slurms_words(monkeypatch):
    """Every kind of job is one sbatch --test-only; SLURM's refusal (its real text, local SLURM 22.05) is the row's
    detail, beside the request; what it accepts is an ok row saying where it would start."""
    monkeypatch.setattr(preflight.shutil, "which", lambda name: "/usr/bin/" + name)
    config = paper(account="physics", gpu_partition="nope")
    run = fake_run(sbatch=lambda command: (1, REFUSED) if "--partition=nope" in command else (0, "sbatch: Job 9 to "
                   "start at 2026-12-07T17:32:40 using 2 processors on nodes vm in partition debug"))  # fmt: skip
    rows = {row.what: row for row in preflight.slurm_checks(config, run, jobs=1)}
    failed = rows["train: sbatch --test-only"]
    assert failed.status == preflight.FAIL and "--partition=nope --time=2880" in failed.detail, failed
    assert failed.detail.endswith("error: invalid partition specified: nope; allocation failure: Invalid partition "
                                  "name specified") and "resources.train.*" in failed.remedy  # fmt: skip
    assert rows["toy: sbatch --test-only"].status == preflight.OK
    assert rows["toy: sbatch --test-only"].detail.startswith("Job 9 to start at")
    assert [c[:2] for c in run.asked if c[0] == "sbatch"] == [["sbatch", "--test-only"]] * len(config["resources"])


def test_a_runtime_sbatch_takes_beyond_the_partitions_or_the_qoss_limit_fails(monkeypatch):
    """Where EnforcePartLimits=NO, SLURM's default, sbatch takes a job longer than its partition's MaxTime, which
    then pends for ever (local SLURM 22.05: PartitionTimeLimit); so does a QOS's MaxWall without DenyOnLimit."""
    monkeypatch.setattr(preflight.shutil, "which", lambda name: "/usr/bin/" + name)
    sinfo = "cpu*|1-00:00:00\ngpu|2-00:00:00\nshort|30:00\n"
    rows = {row.what: row for row in preflight.slurm_checks(paper(gpu_partition="short"), fake_run(sinfo), jobs=1)}
    row = rows["train: sbatch --test-only"]
    assert row.status == preflight.FAIL and "2880 min > 30 min" in row.detail and "runtime to 30" in row.remedy, row
    assert rows["toy: sbatch --test-only"].status == preflight.OK  # 30 min in the default partition, cpu
    run = fake_run(sinfo, qos=QOS)
    row = preflight.stage_check(paper(gpu_partition="gpu", qos="short"), "train", run)
    assert row.status == preflight.FAIL and "2880 min > 240 min" in row.detail
    assert preflight.stage_check(paper(gpu_partition="gpu", qos="long"), "train", run).status == preflight.OK


QOS = "normal|\nlong|7-00:00:00\nshort|04:00:00\n"


def test_the_retry_cap_is_the_smallest_of_the_partitions_and_the_qoss_limits():
    """A comma-separated list of partitions; SLURM's default (marked *) without one; the QOS's MaxWall; none where
    nothing is limited, and none from a QOS sacctmgr may not read."""
    run = fake_run("CLUSTER: alpha\ncpu*|1-00:00:00\ngpu|2-00:00:00\nshort|30:00\nlong|infinite\n", qos=QOS)
    assert preflight.runtime_cap("gpu", "short", run) == 240 and preflight.runtime_cap("gpu", "long", run) == 2880
    assert preflight.runtime_cap("gpu,short", None, run) == 30 and preflight.runtime_cap(None, None, run) == 1440
    assert preflight.runtime_cap("long", "normal", run) is None and preflight.runtime_cap("long", "short", run) == 240
    assert preflight.runtime_cap("gpu", "short", fake_run("gpu|2-00:00:00\n", fails=["qos"])) == 2880
    assert [preflight.minutes(t) for t in ("2-00:00:00", "1:30:00", "30:00", "45", "1:00:01", "infinite", "")] == [
        2880, 90, 30, 45, 61, None, None]  # fmt: skip


def test_no_slurm_here_skips_the_slurm_rows(monkeypatch):
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    (row,) = preflight.slurm_checks(paper())
    assert row.status == preflight.SKIP and "no sbatch" in row.detail


def test_disk_short_of_the_peak_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10**12})())
    row = preflight.disk_check(paper(), tmp_path)
    assert row.status == preflight.FAIL and "1,000 GB free, 5,206 GB still to write" in row.detail, row.detail
    assert "(0 of 158 cells finished)" in row.detail
    assert "GB free, 3,190 GB still to write" in preflight.disk_check(paper(training_slots=1), tmp_path).detail


def finish(root: Path, cells: list[dict]) -> None:
    for cell in cells:
        (root / RUN_DIR.format(**cell)).mkdir(parents=True)
        (root / RUN_DIR.format(**cell) / "summary.json").write_text("{}")


def test_a_grid_in_progress_counts_only_what_it_still_writes(tmp_path):
    """Finished cells' final models and snapshots, staged base models and the checkpoints unfinished cells already
    hold are on disk already: the row compares free space with the rest."""
    config = paper()
    whole = estimate.peak_disk(config).total
    cells = all_cells(config)
    finish(tmp_path, cells[:100])
    for name in config["models"]:
        (tmp_path / "results/models" / name).mkdir(parents=True)
    left, finished = preflight.still_to_write(config, tmp_path)
    assert finished == 100
    assert left.parts["final models"] == pytest.approx(
        sum(2 * estimate.parameters(config, c["model"]) for c in cells[100:]))  # fmt: skip
    assert left.parts["base models"] == 0 and left.total < whole
    training = next(what for what in left.parts if what.startswith(estimate.CHECKPOINTS_TRAINING))
    held = tmp_path / "results/checkpoints" / RUN_DIR.format(**cells[-1]).removeprefix("results/runs/") / "checkpoint-9"
    held.mkdir(parents=True)
    (held / "model.safetensors").write_bytes(b"0" * 10**6)
    assert preflight.still_to_write(config, tmp_path)[0].parts[training] == left.parts[training] - 10**6
    finish(tmp_path, cells[100:])
    assert preflight.still_to_write(config, tmp_path)[0].total == 0


def test_the_peak_counts_kept_checkpoints_only_where_the_config_makes_them():
    """The collapse rule off (the paper's collapse_window: 0): no collapsed cell, no checkpoint kept for it. On: one
    for each cell of K3 in the reward. delete_checkpoints false: every cell keeps two."""
    config = paper()
    assert not [what for what in estimate.peak_disk(config).parts if "collapse" in what or "kept" in what]
    for study in config["studies"].values():
        study["health"]["collapse_window"] = 10
    assert "last checkpoints of 28 cells expected to collapse" in estimate.peak_disk(config).parts
    config["studies"]["unbiased"]["train"]["delete_checkpoints"] = False
    parts = estimate.peak_disk(config).parts
    assert parts["checkpoints kept by 12 cells (delete_checkpoints: false)"] == pytest.approx(12 * 24 * 7.6e9)


def test_the_peak_disk_is_docs_cost_md_s_per_part():
    """docs/cost.md's table: final models 2.4 TB, snapshots 456 GB, base models 39 GB, checkpoints 3 × 96 GB a cell
    (two kept, and Trainer writes the next before it deletes the oldest); none kept: the paper's runs are whole."""
    parts = {what.split(" (")[0]: round(size / estimate.GB) for what, size in estimate.peak_disk(paper()).parts.items()}
    assert parts == {"final models": 2406, "Fig. 12 snapshots": 456, "base models": 39,
                     "checkpoints of the cells training": 2304}  # fmt: skip


def test_the_estimate_prints_held_out_evaluations_and_checkpoint_writes_on_lines_of_their_own():
    """The whole held-out set before the first step and every eval_every steps; heldout_prompts makes it cheaper in
    proportion. A checkpoint of 12 bytes a parameter every checkpoint_every steps at WRITE_BANDWIDTH, on every GPU of
    the cell."""
    config = paper()
    hours = estimate.gpu_hours(config).parts
    writes = next(what for what in hours if what.startswith("checkpoint writes"))
    assert any(line.startswith("  held-out evaluations in training:") for line in estimate.summary(config))
    seconds = 0.0
    for cell in all_cells(config):
        train = config["studies"][cell["study"]]["train"]
        write = 12 * estimate.parameters(config, cell["model"]) / estimate.WRITE_BANDWIDTH
        seconds += write * (train["steps"] // train["checkpoint_every"]) * train_gpus(config, cell["study"])
    assert hours[writes] == pytest.approx(seconds / 3600)
    whole = estimate._heldout_tokens(config, "onpolicy")
    config["studies"]["onpolicy"]["train"]["heldout_prompts"] = 500  # of MATH test's 5,000
    assert estimate._heldout_tokens(config, "onpolicy") == pytest.approx(whole / 10)
    cheaper = estimate.gpu_hours(config).parts["held-out evaluations in training"]
    assert cheaper < hours["held-out evaluations in training"]


def test_heldout_prompts_scores_the_same_subset_in_every_cell():
    """train.heldout_prompts: N of the held-out prompts, drawn once with seed 0 and kept in order; null: all."""
    from klstudy.train.cell import heldout_subset

    records = [{"prompt": str(i)} for i in range(100)]
    subset = heldout_subset(records, 10)
    assert len(subset) == 10 and subset == heldout_subset(records, 10) and subset != records[:10]
    assert subset == sorted(subset, key=lambda r: int(r["prompt"]))
    assert heldout_subset(records, None) is records and heldout_subset(records, 500) is records


def test_gpu_hours_scale_with_the_assumed_throughput_and_name_unknown_sizes():
    def computed(config):  # the parts that FLOPs and throughputs make: not the checkpoint writes
        return sum(h for what, h in estimate.gpu_hours(config).parts.items() if not what.startswith("checkpoint"))

    hours, rates = computed(paper()), paper()["cluster"]["gpu_tflops"]
    assert computed(paper(gpu_tflops={p: r / 2 for p, r in rates.items()})) == pytest.approx(2 * hours)
    config = paper()
    del config["models"]["qwen3-4b-instruct-2507"]["parameters_b"]
    assert estimate.gpu_hours(config).unknown == {"qwen3-4b-instruct-2507"}


def test_each_phase_of_a_training_step_is_divided_by_its_own_throughput():
    """A step's token: 2·N FLOPs generated, 2 × 2·N scored (reference and sampling policy), 6·N trained. Halving one
    phase's throughput adds that phase's share of the training hours, and only to training for the update."""
    config = paper()
    rates = config["cluster"]["gpu_tflops"]
    assert set(rates) == {"generation", "scoring", "update"} and estimate.TRAIN_FLOPS == dict(generation=2, scoring=4,
                                                                                                update=6)  # fmt: skip
    base = estimate.gpu_hours(config).parts
    seconds = {phase: estimate.TRAIN_FLOPS[phase] / rates[phase] for phase in rates}
    for phase in rates:
        slower = estimate.gpu_hours(paper(gpu_tflops={**rates, phase: rates[phase] / 2})).parts
        share = seconds[phase] / sum(seconds.values())
        assert slower["training"] - base["training"] == pytest.approx(base["training"] * share)
        assert (slower["evaluation"] > base["evaluation"]) == (phase == "generation")
        assert (slower["Fig. 12"] > base["Fig. 12"]) == (phase != "update")


def test_a_single_throughput_is_refused_naming_the_key():
    config = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config["cluster"]["gpu_tflops"] = 100
    with pytest.raises(ConfigError, match="cluster.gpu_tflops"):
        validate_config(config)


def test_the_cli_prints_the_table_and_fails_on_a_failing_row(tmp_path, capsys):
    from klstudy.run.cli import run

    with pytest.raises(SystemExit):
        run(["preflight", "--config", str(ROOT / "config/paper.yaml"), "--root", str(tmp_path), "--no-hub"])
    out = capsys.readouterr().out
    assert "evaluation task math_squared" in out and "peak disk under results/" in out and "GPU-hours" in out
    assert "CUDA driver" in out


def test_the_driver_skips_it_saying_what_it_skips(capsys):
    config = paper()
    config["preflight"] = False
    preflight.run_before_submitting(config, Path("."))
    assert "preflight skipped" in capsys.readouterr().out


def test_the_docs_quote_the_computed_costs():
    """The peak disk and GPU-hours that docs/running.md, docs/cost.md and the README quote are estimate.py's."""
    pilot = validate_config(yaml.safe_load((ROOT / "config/pilot.yaml").read_text()))
    pilot_7b = validate_config(yaml.safe_load((ROOT / "config/pilot-7b.yaml").read_text()))
    disk = {n: estimate.peak_disk(paper(training_slots=n)).total / 1e12 for n in (1, 8, 16)}
    hours = estimate.gpu_hours(paper())
    docs = {p: " ".join((ROOT / p).read_text().split()) for p in ("README.md", "docs/running.md", "docs/cost.md")}
    assert f"{disk[8]:.1f} TB with 8 training at once" in docs["README.md"]
    assert (
        f"**{disk[8]:.1f} TB** with `cluster.training_slots: 8` ({disk[1]:.1f} TB with 1, {disk[16]:.1f} TB"
        in (docs["docs/cost.md"])
    )
    assert f"{disk[8]:.1f} TB at 8 slots" in docs["docs/running.md"]
    pilot_disk, pilot_hours = estimate.peak_disk(pilot).total / 1e9, estimate.gpu_hours(pilot).total
    assert (
        f"the paper's grid about {round(hours.total, -2):,.0f} ({round(hours.parts['training'], -2):,.0f} of them "
        f"training), the 7-8B pilot {estimate.gpu_hours(pilot_7b).total:.0f}, the 0.5B pilot {pilot_hours:.1f}."
        in docs["docs/cost.md"]
    )
    assert f"`config/pilot.yaml`) {pilot_disk:.0f} GB" in docs["docs/cost.md"]


# ------------------------------------------------------------------------------------------------- slurm/driver.sbatch

UUID = "0b6f1c9e-3d2a-4c1b-9f00-123456789abc"


def fake_slurm(tmp_path: Path, listed: str) -> tuple[dict, Path]:
    """squeue that lists ``listed`` ("id|state|name|dir|comment" lines) until scancel is called, scancel that records
    its arguments, and a Snakemake that records its own; the environment to run slurm/driver.sbatch in, and its log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    scripts = {
        "squeue": f'[ -e {tmp_path}/cancelled ] || printf "%s" "{listed}"',
        "scancel": f'echo "scancel $*" >> {log}; touch {tmp_path}/cancelled',
        "snakemake": f'echo "snakemake $*" >> {log}',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "100", "SNAKEMAKE": str(bin_dir / "snakemake"),
        "KLSTUDY_PYTHON": str(ROOT / ".venv/bin/python"), "CONFIG": str(ROOT / "config.yaml"), "HOME": str(tmp_path),
    }  # fmt: skip
    return env, log


def test_the_driver_cancels_nothing_an_earlier_one_left_in_the_queue(tmp_path):
    """Jobs an earlier driver left are its Snakemake's to adopt (adopt.py, tests/test_adopt.py): the driver, started
    through a symbolic link, cancels none of them, pending ones included, and starts Snakemake."""
    real = tmp_path / "clone"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    listed = (
        f"100|RUNNING|klstudy-driver|{real}|\n"  # this driver
        f"101|PENDING|{UUID}|{real}|rule_train_rl_wildcards_onpolicy_tiny\n"  # left queued by an earlier driver
        f"102|RUNNING|interactive|{real}|\n"  # salloc
    )
    env, log = fake_slurm(tmp_path, listed)
    done = subprocess.run(["bash", str(ROOT / "slurm/driver.sbatch")], cwd=tmp_path / "link", env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("snakemake --profile slurm") and "--rerun-incomplete" in calls[0]


def test_the_driver_refuses_to_start_while_an_input_from_the_hub_is_not_staged(tmp_path):
    env, log = fake_slurm(tmp_path, "")
    env["CONFIG"] = str(ROOT / "config/pilot.yaml")
    done = subprocess.run(["bash", str(ROOT / "slurm/driver.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "make stage CONFIG=" in done.stderr and "results/models/qwen2.5-0.5b" in done.stderr
    assert not log.exists(), "nothing submitted"
    assert preflight.unstaged(paper(), tmp_path)[-1] == "results/models/qwen3-4b-instruct-2507"
    assert preflight.unstaged(validate_config(yaml.safe_load((ROOT / "config.yaml").read_text())), tmp_path) == []


def test_jobs_above_the_per_user_submit_limit_warn():
    """The profile's jobs against the association's MaxSubmit and the QOS's MaxSubmitPU: a warning, not a failure."""
    assert preflight.profile_jobs() == 100
    row = preflight.submit_limit_check(100, "long", fake_run("50\n", qos="normal|20\nlong|80\n"))
    assert row.status == preflight.WARN and "limit 50" in row.detail and "slurm/profile.yaml" in row.remedy
    row = preflight.submit_limit_check(100, "long", fake_run("\n", qos="normal|20\nlong|80\n"))
    assert row.status == preflight.WARN and "limit 80" in row.detail  # the QOS's, not another QOS's
    assert preflight.submit_limit_check(100, None, fake_run("\n")).status == preflight.OK
    assert preflight.submit_limit_check(100, None, fake_run("", fails=["assoc"])).status == preflight.SKIP
    row = preflight.submit_limit_check(100, None, fake_run("50\n"))
    assert "-> lower jobs in slurm/profile.yaml to 50" in preflight.table([row])  # a warning's remedy is printed


def staged_models(root: Path, tokenizer=None) -> None:
    """The paper's models' config.json (tests/fixtures/model-configs) staged under results/models, with a tokenizer."""
    for source in (ROOT / "tests/fixtures/model-configs").glob("*.json"):
        folder = root / "results/models" / source.stem
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(source.read_text())
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)


@pytest.mark.parametrize(
    "shown, status, words",
    [
        ("PreemptMode             = REQUEUE\nPreemptType = preempt/qos\n", preflight.OK, "PreemptMode=REQUEUE: a pre"),
        ("PreemptMode = OFF\n", preflight.OK, "no job is preempted"),
        ("PreemptMode = CANCEL\n", preflight.WARN, "retries it as a failure"),
        ("PreemptMode = SUSPEND,GANG\n", preflight.OK, "suspended and resumed in place"),
        ("", preflight.SKIP, "names no PreemptMode"),
    ],
)
def test_the_preflight_reads_and_reports_the_preemption_mode(shown, status, words):
    done = lambda command, **_: type("Done", (), {"returncode": 0, "stdout": shown, "stderr": ""})()  # noqa: E731
    row = preflight.preemption_check(done)
    assert (row.what, row.status) == ("preemption", status) and words in row.detail, row


def test_the_paper_scale_requires_an_account(monkeypatch):
    """SLURM takes a job without one (the user's default account), but the SLURM plugin guesses its own."""
    monkeypatch.setattr(preflight.shutil, "which", lambda name: "/usr/bin/" + name)
    rows = {row.what: row for row in preflight.slurm_checks(paper(), fake_run(), jobs=1)}
    assert rows["SLURM account"].status == preflight.FAIL and "cluster.account" in rows["SLURM account"].remedy
    embedded = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    assert "SLURM account" not in {row.what for row in preflight.slurm_checks(embedded, fake_run(), jobs=1)}


@pytest.mark.parametrize(
    "cluster, status, words",
    [
        ({"gpu_model": "h100"}, preflight.OK, "vLLM share"),
        ({"gpu_model": "a100", "gpu_memory_gib": 80}, preflight.OK, "vLLM share"),
        ({"gpu_model": "a100"}, preflight.WARN, "GPU memory unknown; on 80 GiB"),
    ],
)
def test_each_studys_engine_is_planned_from_the_staged_config_json(tmp_path, cluster, status, words):
    staged_models(tmp_path)
    rows = memory_plans.checks(paper(**cluster), tmp_path)[1:]  # after the GPU model's row
    config = paper()
    expected = [f"GPU memory: {study} {model}" for study, spec in config["studies"].items() for model in spec["models"]]
    assert [row.what for row in rows] == expected
    assert {row.status for row in rows} == {status}
    assert all(words in row.detail and "prompts assumed 256 tokens (data not staged)" in row.detail for row in rows)


def test_a_gpu_too_small_for_the_engine_fails_naming_the_model_and_the_numbers(tmp_path):
    staged_models(tmp_path)
    rows = {row.what: row for row in memory_plans.checks(paper(gpu_model="l4"), tmp_path)}  # 22 GiB
    failed = rows["GPU memory: async_math qwen2.5-7b"]
    assert failed.status == preflight.FAIL and "a GPU with more memory" in failed.remedy
    assert failed.detail.startswith("qwen2.5-7b: one 4360-token sequence needs 0.2 GiB of KV cache, but a 22.0 GiB")


def test_without_a_staged_config_json_the_plan_waits_for_staging(tmp_path):
    rows = memory_plans.checks(paper(gpu_model="h100"), tmp_path)[1:]
    assert rows and {row.status for row in rows} == {preflight.SKIP}


def test_staged_prompts_are_measured_in_the_models_chat_template(tmp_path):
    from klstudy.data import procedural, staging
    from klstudy.train import gpu_memory, tiny

    tokenizer = tiny.build_tokenizer()
    staged_models(tmp_path, tokenizer)
    records = procedural.arithmetic("math_train", 20, 0, ["add1w", "sub1w"], "train")
    for name in ("math_train", "math_test", "countdown_train", "countdown_test"):
        staging.write_jsonl(records, tmp_path / f"results/data/{name}.jsonl")
    longest = gpu_memory.longest_prompt(tokenizer, [r["prompt"] for r in records])
    rows = memory_plans.checks(paper(gpu_model="h200"), tmp_path)
    onpolicy = next(row for row in rows if row.what == "GPU memory: onpolicy qwen2.5-7b")
    assert f"max_model_len {longest + 1024 + gpu_memory.SLACK}," in onpolicy.detail
    assert onpolicy.detail.endswith(f"longest prompt {longest} tokens") and "of 140.4 GiB" in onpolicy.detail


@pytest.mark.parametrize(
    "cluster, status, words",
    [
        ({"gpu_model": None}, preflight.FAIL, "cluster.gpu_model and cluster.constraint unset"),
        ({"gpu_model": None, "constraint": "h100"}, preflight.OK, "nodes with feature h100"),
        ({"gpu_model": "v100"}, preflight.FAIL, "v100 has no bfloat16"),
        ({"gpu_model": "h100"}, preflight.OK, "h100, 79.6 GiB"),
        ({"gpu_model": "a100", "gpu_memory_gib": 80}, preflight.OK, "a100, 80 GiB"),
    ],
)
def test_the_paper_scale_names_a_gpu_that_computes_in_bfloat16(tmp_path, cluster, status, words):
    row = memory_plans.checks(paper(**cluster), tmp_path)[0]
    assert (row.what, row.status) == ("GPU model", status) and words in row.detail


def test_the_embedded_scale_has_no_gpu_rows(tmp_path):
    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    assert memory_plans.checks(config, tmp_path) == []


# ------------------------------------------------------------------------------- the driver's CUDA against the wheels'

# nvidia-smi's output as real machines printed it (quoted from public pages): driver 535.183.06 (CUDA 12.2, a GTX
# 1080), driver 580.95.05 (CUDA 13.0, a GB10), and its message where the driver does not answer.
NVIDIA_SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"


@pytest.mark.parametrize(
    ("printed", "wheel", "status", "words"),
    [
        ("driver-580.95.05.txt", "13.0", preflight.OK, "driver 580.95.05 supports CUDA 13.0"),
        ("driver-535.183.06.txt", "13.0", preflight.FAIL, "driver 535.183.06 supports CUDA 12.2: too old"),
        ("driver-535.183.06.txt", "12.8", preflight.WARN, "minor-version compatibility"),
        ("driver-535.183.06.txt", "12.1", preflight.OK, "built for CUDA 12.1; this node's driver 535.183.06"),
        ("no-driver.txt", "13.0", preflight.FAIL, "couldn't communicate with the NVIDIA driver"),
    ],
)
def test_the_nodes_driver_is_compared_with_the_cuda_torch_was_built_for(printed, wheel, status, words):
    row = cuda.cuda_check(".venv-vllm", (NVIDIA_SMI / printed).read_text(), "2.13.0", wheel)
    assert row.status == status and words in row.detail, row
    assert row.what == "CUDA driver: .venv-vllm" and (status == preflight.OK) == (row.remedy == "")  # a way out


def test_a_cpu_build_of_torch_fails_beside_a_gpu():
    row = cuda.cuda_check(".venv", (NVIDIA_SMI / "driver-580.95.05.txt").read_text(), "2.13.0+cpu", None)
    assert row.status == preflight.FAIL and "torch 2.13.0+cpu is a CPU build" in row.detail


def fake_node(printed: str, builds: dict[str, str]):
    """subprocess.run on a GPU node: nvidia-smi prints the fixture ``printed``; each interpreter prints its torch's
    version and CUDA (``builds``: interpreter path -> "version cuda"), or fails where it is missing."""

    def run(command, **kwargs):
        if command == ["nvidia-smi"]:
            return type("Done", (), {"stdout": (NVIDIA_SMI / printed).read_text(), "stderr": "", "returncode": 0})()
        if command[0] not in builds:
            raise FileNotFoundError(2, "No such file or directory", command[0])
        return type("Done", (), {"stdout": builds[command[0]].replace(" ", "\n"), "stderr": "", "returncode": 0})()

    return run


def test_each_environment_of_the_runs_gpu_jobs_has_its_row(monkeypatch, tmp_path):
    """The paper's config runs vLLM: the preflight's own environment and vllm_python are each compared; a vLLM
    environment not built yet fails naming `make vllm-env`."""
    monkeypatch.setattr(preflight.shutil, "which", lambda name: f"/usr/bin/{name}")
    config = paper()
    vllm_python = str(tmp_path / config["vllm_python"])
    builds = {cuda.sys.executable: "2.13.0+cu130 13.0", vllm_python: "2.13.0+cu130 13.0"}
    rows = cuda.cuda_checks(config, tmp_path, fake_node("driver-535.183.06.txt", builds))
    assert [row.status for row in rows] == [preflight.FAIL, preflight.FAIL], rows
    assert "this environment" in rows[0].what and f"vllm_python ({vllm_python})" in rows[1].what
    del builds[vllm_python]
    rows = cuda.cuda_checks(config, tmp_path, fake_node("driver-580.95.05.txt", builds))
    assert rows[0].status == preflight.OK and rows[1].status == preflight.FAIL, rows
    assert "torch cannot be read" in rows[1].detail and rows[1].remedy == "make vllm-env VLLM_FLAVOUR=gpu"


def test_without_nvidia_smi_or_gpu_jobs_the_cuda_row_says_so_and_skips(monkeypatch):
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    (row,) = cuda.cuda_checks(paper(), run=None)  # nothing is run
    assert row.status == preflight.SKIP and "no nvidia-smi here" in row.detail
    monkeypatch.setattr(preflight.shutil, "which", lambda name: f"/usr/bin/{name}")
    (row,) = cuda.cuda_checks(validate_config(yaml.safe_load((ROOT / "config.yaml").read_text())), run=None)
    assert row.status == preflight.SKIP and "no job of this run asks for a GPU" in row.detail
