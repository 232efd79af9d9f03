"""`klstudy preflight`: what a run needs from the hub, its data and the cluster, checked on the login node before any
job is submitted, in one table with a remedy per failing row.

- hub: every hub model and dataset of the config can be downloaded with this machine's token (huggingface_hub's
  ``auth_check``; a revision other than main with ``repo_info``); each of the hub's errors becomes one sentence.
- sources: every dataset and model with ``local_dir`` has it; a dataset with no known public copy (MATH²) has one.
- SLURM (skipped where there is no ``sinfo``: a local run): the account, each kind of job's partition, its runtime
  against the partition's MaxTime, and GPUs of the asked kind in the GPU partition.
- disk: free space under results/ against the run's peak (estimate.py), which is printed with the GPU-hours.

`snakemake --profile slurm` runs it (the Snakefile's ``onstart``) unless ``--config preflight=False``.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from klstudy import estimate

OK, FAIL, SKIP = "ok", "FAIL", "skip"
# Datasets whose hub source is not a known public copy: staged only from a local copy.
NO_PUBLIC_COPY = {"math_squared"}


@dataclass
class Check:
    what: str
    status: str
    detail: str
    remedy: str = ""


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
        if spec.get("hub_id")
        and not spec.get("local_dir")
        and spec["kind"] not in NO_PUBLIC_COPY
        and not (staged / "data" / f"{name}.jsonl").exists()
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
        return [Check("hub", SKIP, f"HF_HUB_OFFLINE is set: {len(repos)} repositories from the cache (HF_HOME)")]
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
        if spec["kind"] in NO_PUBLIC_COPY and not spec.get("local_dir") and not staged:
            checks.append(
                Check(
                    f"evaluation task {task}",
                    FAIL,
                    f"no local copy, and {spec.get('hub_id')} is not a known public copy",
                    f"set data.{task}.local_dir to a copy of it, or drop {task} from evaluation.tasks",
                )
            )
        else:
            checks.append(Check(f"evaluation task {task}", OK, "staged" if staged else "has a source"))
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
class Partition:
    name: str
    max_minutes: int | None
    gres: list[str]
    default: bool


def partitions(run=subprocess.run) -> dict[str, Partition]:
    """The cluster's partitions (sinfo), by name."""
    out = run(["sinfo", "-h", "-o", "%P|%l|%G"], capture_output=True, text=True, check=True, timeout=30).stdout
    found: dict[str, Partition] = {}
    for line in out.splitlines():
        name, limit, gres = line.strip().split("|")
        part = found.setdefault(name.rstrip("*"), Partition(name.rstrip("*"), minutes(limit), [], name.endswith("*")))
        part.gres += [g for g in gres.split(",") if g and g != "(null)"]
    return found


def partition_max_minutes(name: str | None) -> int | None:
    """MaxTime of partition ``name`` (the default partition for None), or None when unknown or unlimited: what a
    retry may ask for at most (workflow/rules/common.smk)."""
    try:
        found = partitions()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    part = found.get(name) if name else next((p for p in found.values() if p.default), None)
    return part.max_minutes if part else None


def gpus_in(gres: list[str], model: str | None) -> int:
    """The most GPUs (of ``model``, if given) one node of these GRES entries has (``gpu:a100:8(S:0-1)``)."""
    most = 0
    for entry in gres:
        fields = re.sub(r"\(.*\)$", "", entry).split(":")
        if fields[0] != "gpu" or not fields[-1].isdigit():
            continue
        kind = fields[1] if len(fields) == 3 else None
        if model is None or kind == model:
            most = max(most, int(fields[-1]))
    return most


def account_check(account: str | None, run=subprocess.run) -> Check:
    if account is None:
        return Check("SLURM account", OK, "unset: SLURM's default for this user", "")
    user = getpass.getuser()
    done = run(
        ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=Account"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode:
        return Check(f"SLURM account {account}", FAIL, f"sacctmgr failed: {done.stderr.strip()[:200]}",
                     "run where the cluster's commands work")  # fmt: skip
    out = done.stdout
    accounts = sorted({line.strip() for line in out.splitlines() if line.strip()})
    if account in accounts:
        return Check(f"SLURM account {account}", OK, f"{user} may use it")
    return Check(
        f"SLURM account {account}",
        FAIL,
        f"{user} has no association with it (has: {', '.join(accounts) or 'none'})",
        "set cluster.account to one of yours",
    )


def runtime_check(stage: str, minutes_asked: int, part: Partition) -> Check:
    limit = "no limit" if part.max_minutes is None else f"MaxTime {part.max_minutes} min"
    if part.max_minutes is None or minutes_asked <= part.max_minutes:
        return Check(f"{stage}: runtime", OK, f"{minutes_asked} min on {part.name} ({limit})")
    return Check(
        f"{stage}: runtime", FAIL, f"{minutes_asked} min > {part.name}'s {limit}",
        f"lower resources.{stage}.runtime to {part.max_minutes} (a cell resumes on its retry) or pick a partition "
        "with a longer MaxTime",
    )  # fmt: skip


def gpu_check(stage: str, gpus: int, model: str | None, part: Partition) -> Check:
    have, asked = gpus_in(part.gres, model), estimate.gpu_gres(gpus, model)
    if have >= gpus:
        return Check(f"{stage}: GPUs", OK, f"{asked} per node; {part.name}'s nodes have up to {have}")
    return Check(
        f"{stage}: GPUs", FAIL, f"{asked} per node; {part.name} has {', '.join(part.gres) or 'no GRES'}",
        f"set cluster.gpu_partition / cluster.gpu_model to what sinfo -o %G lists, or lower resources.{stage}.gpus",
    )  # fmt: skip


def stage_checks(config: dict, found: dict[str, Partition]) -> list[Check]:
    """Each kind of job: its partition exists, its runtime fits MaxTime, its GPUs exist there."""
    checks = []
    default = next((p.name for p in found.values() if p.default), None)
    for stage, spec in config["resources"].items():
        key = "gpu_partition" if spec["gpus"] else "cpu_partition"
        name = config["cluster"][key] or default
        if name not in found:
            remedy = f"set cluster.{key} to one of: " + ", ".join(sorted(found))
            checks.append(Check(f"{stage}: partition {name}", FAIL, "no such partition", remedy))
            continue
        checks.append(runtime_check(stage, spec["runtime"], found[name]))
        if spec["gpus"]:
            checks.append(gpu_check(stage, spec["gpus"], config["cluster"]["gpu_model"], found[name]))
    return checks


def slurm_checks(config: dict, run=subprocess.run) -> list[Check]:
    if shutil.which("sinfo") is None:
        return [Check("SLURM", SKIP, "no sinfo here (a run without SLURM): account, partitions, GPUs not checked")]
    try:
        found = partitions(run)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return [Check("SLURM", FAIL, f"sinfo failed: {error}", "run where the cluster's commands work")]
    return [account_check(config["cluster"]["account"], run), *stage_checks(config, found)]


# ---------------------------------------------------------------------------------------------------------------- disk


def disk_check(config: dict, root: Path) -> Check:
    peak = estimate.peak_disk(config)
    where = root / "results"
    existing = next(p for p in [where, *where.parents] if p.exists())
    free = shutil.disk_usage(existing).free
    detail = f"{free / estimate.GB:,.0f} GB free, peak {peak.total / estimate.GB:,.0f} GB{peak.note()}"
    if free >= peak.total:
        return Check("disk under results/", OK, detail)
    return Check(
        "disk under results/", FAIL, detail,
        "free space, lower cluster.training_slots, or link results/ to a larger file system",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ together


def checks(config: dict, root: Path, hub: bool = True, client=None) -> list[Check]:
    rows = hub_checks(config, root, client) if hub else [Check("hub", SKIP, "--no-hub: not checked")]
    return [*rows, *source_checks(config, root), *slurm_checks(config), disk_check(config, root)]


def table(rows: list[Check]) -> str:
    width = max(len(r.what) for r in rows)
    lines = [f"{'check':<{width}}  {'status':<6}  detail", f"{'-' * width}  ------  ------"]
    for r in rows:
        lines.append(f"{r.what:<{width}}  {r.status:<6}  {r.detail}")
        if r.remedy and r.status == FAIL:
            lines.append(f"{'':<{width}}  {'':<6}  -> {r.remedy}")
    return "\n".join(lines)


def report(config: dict, root: Path, hub: bool = True, client=None) -> tuple[bool, str]:
    """(every check passed, the table and the estimates)."""
    rows = checks(config, root, hub, client)
    failed = [r for r in rows if r.status == FAIL]
    verdict = f"preflight: {len(failed)} of {len(rows)} checks failed" if failed else "preflight: all checks pass"
    return not failed, "\n".join([table(rows), "", *estimate.summary(config), verdict])


def run_before_submitting(config: dict, root: Path) -> None:
    """The Snakefile's onstart: the preflight, or a line that says what is skipped; a failure stops the run."""
    if not config["preflight"]:
        print("preflight skipped (preflight=False): hub access, data sources, SLURM account, partitions, time limits,"
              " GPUs and disk are not checked", flush=True)  # fmt: skip
        return
    passed, text = report(config, root)
    print(text, flush=True)
    if not passed:
        raise SystemExit("preflight failed: fix the rows marked FAIL, or run with --config preflight=False")
