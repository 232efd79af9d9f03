"""`klstudy preflight`: what a run needs from the hub, its data and the cluster, checked on the login node before any
job is submitted, in one table with a remedy per failing row (the rows: docs/running.md, **The preflight**). The
GPU memory rows are memory_plans.py's, the CUDA rows cuda.py's. `snakemake --profile slurm` runs it (the Snakefile's
``onstart``) unless ``--config preflight=False``.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from klstudy.config import REPO_ROOT, RUN_DIR, all_cells, train_gpus
from klstudy.run import cuda, estimate, memory_plans
from klstudy.run.check import FAIL, OK, SKIP, WARN, Check

# ------------------------------------------------------------------------------------------------------------ the hub


def hub_repos(config: dict, root: Path) -> list[tuple[str, str, str, str]]:
    """(config key, repo id, repo type, revision) of every hub download the config still makes: not for an entry
    with a local copy, nor one already staged under results/."""
    staged = root / "results"
    repos = [
        (f"models.{name}", spec["hub_id"], "model", spec.get("revision", "main"))
        for name, spec in config["models"].items()
        if spec["source"] == "hub" and not spec.get("local_dir") and not (staged / "models" / name).exists()
    ]
    repos += [
        (f"data.{name}", spec["hub_id"], "dataset", "main")
        for name, spec in config["data"].items()
        if spec.get("hub_id") and not spec.get("local_dir") and not (staged / "data" / f"{name}.jsonl").exists()
    ]
    return repos


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
    return (
        f"hub unreachable ({type(error).__name__})",
        "run where the hub is reachable, or stage a copy and set local_dir",
    )


def hub_client():
    from huggingface_hub import HfApi

    return HfApi()


def hub_checks(config: dict, root: Path, client=None) -> list[Check]:
    repos = hub_repos(config, root)
    if not repos:
        return [Check("hub", OK, "nothing to download")]
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return [
            Check("hub", SKIP, f"HF_HUB_OFFLINE is set: {len(repos)} repositories not asked, from the cache (HF_HOME)")
        ]
    from huggingface_hub import get_token

    client = client or hub_client()
    token = get_token()
    checks = [
        Check("hub token", OK, "set")
        if token
        else Check("hub token", OK, "none: public repositories only", "for gated ones, `hf auth login`")
    ]
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
    """The staged inputs (results/data/<name>.jsonl, results/models/<name>) that come from the hub and are not there
    yet: what a driver without network (HF_HUB_OFFLINE=1, slurm/driver.sbatch) cannot make. Inputs built or generated
    here, or copied from a local_dir, need no network and are left to the run."""
    missing = [
        f"results/data/{name}.jsonl"
        for name, spec in config["data"].items()
        if spec.get("hub_id") and not spec.get("local_dir") and not (root / f"results/data/{name}.jsonl").exists()
    ]
    missing += [
        f"results/models/{name}"
        for name, spec in config["models"].items()
        if (spec.get("hub_id") or spec.get("package"))  # a hub model, or a GGUF file from a PyPI package
        and not spec.get("local_dir")
        and not (root / f"results/models/{name}").exists()
    ]
    return missing


# -------------------------------------------------------------------------------------------------------- the sources


def source_checks(config: dict, root: Path) -> list[Check]:
    """Local copies exist; every evaluation task has a source."""
    checks = []
    for section in ("models", "data"):
        for name, spec in config[section].items():
            local = spec.get("local_dir")
            if local and not Path(local).exists():
                checks.append(
                    Check(
                        f"{section}.{name}.local_dir", FAIL, f"{local} does not exist", "copy it there or fix the path"
                    )
                )
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
        return None  # infinite, UNLIMITED, n/a
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    hours, mins, secs = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + hours * 60 + mins + (secs > 0)


@dataclass
class Node:
    gres: list[str]
    mem_mb: int | None  # RealMemory (sinfo %m)
    cpus: int | None  # sinfo %c


@dataclass
class Partition:
    name: str
    max_minutes: int | None
    gres: list[str]  # the distinct GRES entries of its nodes
    default: bool
    nodes: list[Node] = field(default_factory=list)


# One line per node and partition: partition, MaxTime, GRES, memory (MB), CPUs.
SINFO = ["sinfo", "-N", "-h", "-o", "%P|%l|%G|%m|%c"]


def split_gres(text: str) -> list[str]:
    """sinfo's %G split into entries, not at the commas inside parentheses (``gpu:a100:4(S:0,2),shard:8``)."""
    return [g for g in re.split(r",(?![^()]*\))", text.strip()) if g and g != "(null)"]


def _number(text: str) -> int | None:
    found = re.match(r"\d+", text.strip())
    return int(found.group()) if found else None


def partitions(run=subprocess.run) -> dict[str, Partition]:
    """The cluster's partitions (sinfo), by name, with their nodes. ``CLUSTER:`` headers (SLURM_CLUSTERS set) and
    blank lines are skipped."""
    out = run(SINFO, capture_output=True, text=True, check=True, timeout=30).stdout
    found: dict[str, Partition] = {}
    for line in out.splitlines():
        if "|" not in line:
            continue  # CLUSTER: name, or nothing
        name, limit, gres, *rest = line.strip().split("|")
        mem, cpus = (*rest, "", "")[:2]
        part = found.setdefault(name.rstrip("*"), Partition(name.rstrip("*"), minutes(limit), [], name.endswith("*")))
        entries = split_gres(gres)
        part.gres += [g for g in entries if g not in part.gres]
        part.nodes.append(Node(entries, _number(mem), _number(cpus)))
    return found


def partition_names(names: str | None, found: dict[str, Partition]) -> list[str]:
    """A partition, or SLURM's comma-separated list of them (``gpu,gpu_long``); the default partition for None."""
    if not names:
        default = next((p.name for p in found.values() if p.default), None)
        return [default] if default else []
    return [name.strip() for name in names.split(",") if name.strip()]


def qos_limits(run=subprocess.run) -> dict[str, int | None]:
    """MaxWall of every QOS (sacctmgr), by lowercase name; None for no limit."""
    out = run(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxWall"], capture_output=True, text=True,
              check=True, timeout=30).stdout  # fmt: skip
    limits = {}
    for line in out.splitlines():
        if "|" in line:
            name, wall = line.strip().split("|")[:2]
            limits[name.lower()] = minutes(wall) if wall else None
    return limits


def runtime_cap(partition: str | None, qos: str | None, run=subprocess.run) -> int | None:
    """What a job may ask for at most: the smallest of the partitions' MaxTime (the default partition for None) and
    the QOS's MaxWall; None when neither is known or limited, and then a retry asks the runtime times its attempt
    (workflow/rules/common.smk)."""
    limits = []
    try:
        found = partitions(run)
        limits += [found[name].max_minutes for name in partition_names(partition, found) if name in found]
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    if qos:
        try:
            limits.append(qos_limits(run).get(qos.lower()))
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


MIG = re.compile(r"^\d+g\.\d+gb$")  # a MIG slice's GRES type (gpu:1g.10gb:7), not a whole GPU


def _gpu_entries(gres: list[str]):
    """(type or None, count) of each gpu entry (``gpu:a100:8(S:0-1)``)."""
    for entry in gres:
        fields = re.sub(r"\(.*\)$", "", entry).split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            yield (fields[1] if len(fields) == 3 else None), int(fields[-1])


def gpus_in(gres: list[str], model: str | None) -> int:
    """The most GPUs (of ``model``, if given) one node of these GRES entries has. Without a model, MIG slices
    (gpu:1g.10gb:7) are not whole GPUs and do not count."""
    counts = [n for kind, n in _gpu_entries(gres) if (kind == model if model else not (kind and MIG.match(kind)))]
    return max(counts, default=0)


def mig_slices(gres: list[str]) -> list[str]:
    return [entry for entry in gres if any(kind and MIG.match(kind) for kind, _ in _gpu_entries([entry]))]


def account_check(account: str | None, run=subprocess.run, required: bool = False) -> Check:
    """The account exists for this user. Unset, SLURM charges the user's default account, and the SLURM plugin the
    account of the user's last job: at the paper's scale (``required``), weeks of GPUs are not left to that guess."""
    if account is None:
        if required:
            return Check("SLURM account", FAIL, "unset: the plugin would charge the account of your last job",
                         "set cluster.account (sacctmgr show assoc user=$USER format=Account)")  # fmt: skip
        return Check("SLURM account", OK, "unset: SLURM's default for this user", "")
    user = getpass.getuser()
    what = f"SLURM account {account}"
    try:
        done = run(
            ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=Account"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        return Check(what, SKIP, f"sacctmgr cannot run here ({error}): not checked")
    if done.returncode:  # e.g. sacctmgr not permitted to users on this cluster
        return Check(what, SKIP, f"sacctmgr refused ({(done.stderr or '').strip()[:160]}): not checked")
    accounts = sorted({line.strip().lower() for line in done.stdout.splitlines() if line.strip()})
    if account.lower() in accounts:  # SLURM keeps account names in lowercase
        return Check(what, OK, f"{user} may use it")
    return Check(
        what, FAIL,
        f"{user} has no association with it (has: {', '.join(accounts) or 'none'})",
        "set cluster.account to one of yours",
    )  # fmt: skip


def qos_check(qos: str | None, run=subprocess.run) -> tuple[list[Check], int | None]:
    """The QOS row and its MaxWall in minutes (None: no limit, or not known)."""
    if not qos:
        return [], None
    try:
        limits = qos_limits(run)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        detail = getattr(error, "stderr", None) or str(error)
        return [
            Check(f"SLURM QOS {qos}", SKIP, f"sacctmgr refused ({detail.strip()[:160]}): MaxWall not checked")
        ], None
    if qos.lower() not in limits:
        remedy = "set cluster.qos to one of: " + ", ".join(sorted(limits))
        return [Check(f"SLURM QOS {qos}", FAIL, "no such QOS", remedy)], None
    wall = limits[qos.lower()]
    return [Check(f"SLURM QOS {qos}", OK, "no MaxWall" if wall is None else f"MaxWall {wall} min")], wall


def runtime_check(stage: str, minutes_asked: int, parts: list[Partition], qos: tuple[str, int | None] = ("", None)):
    """The runtime against the smallest of the partitions' MaxTime and the QOS's MaxWall."""
    limits = [(p.max_minutes, f"{p.name}'s MaxTime {p.max_minutes} min") for p in parts if p.max_minutes is not None]
    if qos[1] is not None:
        limits.append((qos[1], f"QOS {qos[0]}'s MaxWall {qos[1]} min"))
    where = ",".join(p.name for p in parts)
    if not limits:
        return Check(f"{stage}: runtime", OK, f"{minutes_asked} min on {where} (no limit)")
    limit, said = min(limits)
    if minutes_asked <= limit:
        return Check(f"{stage}: runtime", OK, f"{minutes_asked} min on {where} ({said})")
    return Check(
        f"{stage}: runtime", FAIL, f"{minutes_asked} min > {said}",
        f"lower resources.{stage}.runtime to {limit} (a cell resumes on its retry) or pick a partition or QOS "
        "with a longer limit",
    )  # fmt: skip


def gpu_check(stage: str, gpus: int, model: str | None, parts: list[Partition]) -> Check:
    gres = [g for p in parts for g in p.gres]
    have, asked = gpus_in(gres, model), estimate.gpu_gres(gpus, model)
    where = ",".join(p.name for p in parts)
    slices = mig_slices(gres) if model is None else []
    note = f" (MIG slices, not counted as GPUs: {', '.join(slices)})" if slices else ""
    if have >= gpus:
        return Check(f"{stage}: GPUs", OK, f"{asked} per node; {where}'s nodes have up to {have}{note}")
    return Check(
        f"{stage}: GPUs", FAIL, f"{asked} per node; {where} has {', '.join(gres) or 'no GRES'}{note}",
        f"set cluster.gpu_partition / cluster.gpu_model to what sinfo -o %G lists, or lower resources.{stage}.gpus",
    )  # fmt: skip


def node_check(stage: str, spec: dict, model: str | None, parts: list[Partition]) -> Check:
    """A GPU job's memory and CPUs fit a node of its partition that has its GPUs (on as many nodes as it asks)."""
    nodes = [node for p in parts for node in p.nodes if gpus_in(node.gres, model) >= spec["gpus"]]
    fits = [
        node
        for node in nodes
        if (node.mem_mb is None or spec["mem_mb"] <= node.mem_mb) and (node.cpus is None or spec["cpus"] <= node.cpus)
    ]
    asked = f"{spec['mem_mb']} MB and {spec['cpus']} CPUs per node"
    if len(fits) >= spec["nodes"]:
        return Check(f"{stage}: node size", OK, f"{asked}; {len(fits)} node(s) with its GPUs fit")
    most_mem = max((n.mem_mb for n in nodes if n.mem_mb is not None), default=0)
    most_cpus = max((n.cpus for n in nodes if n.cpus is not None), default=0)
    return Check(
        f"{stage}: node size", FAIL,
        f"{asked} on {spec['nodes']} node(s); {len(fits)} of the {len(nodes)} nodes with its GPUs fit (at most "
        f"{most_mem} MB, {most_cpus} CPUs)",
        f"lower resources.{stage}.mem_mb to {most_mem} / resources.{stage}.cpus to {most_cpus} at most, or pick a "
        "partition with larger nodes",
    )  # fmt: skip


def stage_checks(config: dict, found: dict[str, Partition], qos_minutes: int | None = None) -> list[Check]:
    """Each kind of job: its partitions exist, its runtime fits MaxTime and the QOS's MaxWall, its GPUs exist there,
    and a node with them has its memory and CPUs."""
    checks = []
    qos = (config["cluster"].get("qos") or "", qos_minutes)
    for stage, spec in config["resources"].items():
        key = "gpu_partition" if spec["gpus"] else "cpu_partition"
        names = partition_names(config["cluster"][key], found)
        missing = [name for name in names if name not in found] or ([] if names else [None])
        if missing:
            remedy = f"set cluster.{key} to one of: " + ", ".join(sorted(found))
            checks.append(Check(f"{stage}: partition {','.join(map(str, missing))}", FAIL, "no such partition", remedy))
            continue
        parts = [found[name] for name in names]
        checks.append(runtime_check(stage, spec["runtime"], parts, qos))
        if spec["gpus"]:
            if stage == "train":  # the most any study's cells ask (studies.<study>.gpus)
                spec = {**spec, "gpus": max(train_gpus(config, study) for study in config["studies"])}
            checks.append(gpu_check(stage, spec["gpus"], config["cluster"]["gpu_model"], parts))
            if checks[-1].status == OK:
                checks.append(node_check(stage, spec, config["cluster"]["gpu_model"], parts))
    return checks


def profile_jobs(root: Path = REPO_ROOT) -> int | None:
    """``jobs`` of slurm/profile.yaml: the jobs Snakemake keeps queued or running at once."""
    import yaml

    try:
        return yaml.safe_load((root / "slurm/profile.yaml").read_text()).get("jobs")
    except (OSError, AttributeError, yaml.YAMLError):
        return None


def submit_limit_check(jobs: int | None, qos: str | None, run=subprocess.run) -> Check:
    """The profile's ``jobs`` against the per-user submit limits: the association's MaxSubmit and the QOS's
    MaxSubmitPU (sacctmgr). Above them, sbatch refuses the jobs beyond the limit: a warning, as they are retried."""
    what = f"jobs at once ({jobs})"
    if not jobs:
        return Check(what, SKIP, "no jobs in slurm/profile.yaml")
    commands = [["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={getpass.getuser()}", "format=MaxSubmit"]]
    if qos:
        commands.append(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxSubmitPU"])
    limits = []
    for command in commands:
        try:
            done = run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as error:
            return Check(what, SKIP, f"sacctmgr cannot run here ({error}): submit limits not checked")
        if done.returncode:
            return Check(what, SKIP, f"sacctmgr refused ({(done.stderr or '').strip()[:160]}): limits not checked")
        for line in done.stdout.splitlines():
            fields = line.strip().split("|")
            if "qos" in command and fields[0].lower() != qos.lower():
                continue
            limits += [int(fields[-1])] if fields[-1].isdigit() else []
    if not limits or jobs <= min(limits):
        return Check(what, OK, f"within MaxSubmit {min(limits)}" if limits else "no per-user submit limit")
    return Check(
        what, WARN, f"above the per-user submit limit {min(limits)}: sbatch refuses the jobs beyond it",
        f"lower jobs in slurm/profile.yaml to {min(limits)} (or `--jobs {min(limits)}`)",
    )  # fmt: skip


PREEMPTION = {  # PreemptMode's first word: what happens to a preempted job of this run
    "OFF": "no job is preempted",
    "REQUEUE": "a preempted job goes back to the queue (the profile's --requeue); a cell resumes from its checkpoint",
    "CANCEL": "a preempted job is cancelled; the workflow retries it as a failure (a training cell 3 times)",
    "SUSPEND": "a preempted job is suspended and resumed in place",
}


def preemption_check(run=subprocess.run) -> Check:
    """The cluster's PreemptMode (scontrol show config), and what it does to this run's jobs."""
    try:
        done = run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return Check("preemption", SKIP, f"scontrol cannot run here ({error}): not read")
    found = re.search(r"^PreemptMode\s*=\s*(\S+)", done.stdout, re.M)
    if done.returncode or not found:
        return Check("preemption", SKIP, "scontrol show config names no PreemptMode: not read")
    mode = found[1].upper()
    said = PREEMPTION.get(mode.split(",")[0], "see the cluster's documentation")
    if mode.startswith("CANCEL"):
        remedy = "a partition or QOS that is not preempted, for training (cluster.gpu_partition, cluster.qos)"
        return Check("preemption", WARN, f"PreemptMode={mode}: {said}", remedy)
    return Check("preemption", OK, f"PreemptMode={mode}: {said}")


def slurm_checks(config: dict, run=subprocess.run, jobs: int | None = None) -> list[Check]:
    if shutil.which("sinfo") is None:
        return [Check("SLURM", SKIP, "no sinfo here (a run without SLURM): account, partitions, GPUs not checked")]
    try:
        found = partitions(run)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return [Check("SLURM", FAIL, f"sinfo failed: {error}", "run where the cluster's commands work")]
    qos_rows, qos_minutes = qos_check(config["cluster"].get("qos"), run)
    limit = submit_limit_check(jobs or profile_jobs(), config["cluster"].get("qos"), run)
    return [
        account_check(config["cluster"]["account"], run, required=config["scale"] == "paper"),
        *qos_rows,
        limit,
        preemption_check(run),
        *stage_checks(config, found, qos_minutes),
    ]


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
