"""The pipeline's stages as `klstudy` subcommands: one per stage, each called by one Snakemake rule.

Every stage can be run (and debugged) without Snakemake; the rules only wire paths together. One convention hands
settings to a stage: ``--settings`` is the part of the validated config the stage reads, as JSON (a dataset's entry,
the toy section, a cell's settings from ``config.cell_settings``, the evaluation or divergence section); stages that
read the whole config take it as a file path (``--config``). Defaults live in the schema alone. Each stage imports
what it needs inside its function: every job is a process of its own, and start-up is a large part of a small one.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from pathlib import Path

from klstudy.run import subcommands, toy_stages
from klstudy.run.devices import threads as _threads
from klstudy.run.devices import threads_per_process
from klstudy.run.subcommands import PNG, STUDY, TABLES, THREADS, VALIDATED, as_json, config_files, opt, read_config, req

STAGES = dict(toy_stages.STAGES)  # subcommand: (its function, its help, its options); the §3 analysis's first
stage = functools.partial(subcommands.command, STAGES)


def run(argv: list[str]) -> int:
    """Run the stage ``argv`` names in this process (as warm.py's server does)."""
    return subcommands.run(argv, subcommands.build_parser(STAGES, __doc__))


@stage("prepare-data", "stage one dataset as JSONL in the common schema",
       name=req("the dataset's name under 'data'"), settings=as_json("the dataset's config entry"),
       out=req("the staged JSONL (a .check.json is written beside it)"))  # fmt: skip
def _prepare_data(args):
    from klstudy import config
    from klstudy.data import staging

    records = staging.prepare(args.name, config.dataset_settings(args.name, args.settings), Path(args.out))
    print(f"dataset {args.name}: {len(records)} records -> {args.out}")


@stage("base-model", "build the tiny model, or stage a hub model, in HF format",
       name=req("the model's alias under 'models'"), settings=as_json("the model's config entry"),
       warm_start_data=opt("staged JSONL files (embedded models)", nargs="*", default=[]), **THREADS,
       out=req("the model directory (Hugging Face format)"))  # fmt: skip
def _base_model(args):
    from klstudy.train import models

    _threads(args.threads)
    models.build_base_model(args.name, args.settings, args.warm_start_data, Path(args.out))


@stage("pin-base-model", "build an embedded base model as its pinned copy",
       configfile=config_files("the config naming the model"), model=req("the model's alias under 'models'"),
       out=opt("where to write it (default: the model's pinned.path)"), **THREADS)  # fmt: skip
def _pin_base_model(args):
    """Build an embedded model afresh on this machine, from its config's warm-start data, into its ``pinned.path``
    (or ``--out``): the way to make the repository's pinned copy after changing its spec or its data."""
    import tempfile

    from klstudy import config
    from klstudy.data import staging
    from klstudy.train import models

    _threads(args.threads)
    settings = read_config(args.configfile)
    spec = settings["models"].get(args.model)
    if spec is None or spec["source"] != "embedded":
        raise SystemExit(f"{' '.join(args.configfile)}: no embedded model {args.model!r} under 'models'")
    if not args.out and "pinned" not in spec:
        raise SystemExit(f"models.{args.model} has no 'pinned' entry: give --out")
    out = Path(args.out) if args.out else models.pinned_directory(spec["pinned"])
    with tempfile.TemporaryDirectory(prefix="klstudy-pin-") as staged:
        paths = [Path(staged) / f"{name}.jsonl" for name in spec["warm_start_data"]]
        for path in paths:
            staging.prepare(path.stem, config.dataset_settings(path.stem, settings["data"][path.stem]), path)
        built = Path(staged) / "model"
        models.build_base_model(args.model, {k: v for k, v in spec.items() if k != "pinned"}, paths, built)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(built, out)
    print(f"models.{args.model}: built into {out}; set models.{args.model}.pinned.sha256 to "
          f"{models.base_model_digest(out)}")  # fmt: skip


@stage("train", "RL-train one grid cell (resumes from its last checkpoint)",
       settings=as_json("the cell's settings (config.cell_settings)"),
       model=req("base model directory (Hugging Face format)"),
       train_data=req("staged JSONL of the training prompts"),
       heldout_data=req("staged JSONL of the held-out questions (pass@1)"),
       out=req("cell directory: metrics.jsonl, heldout.jsonl, summary.json, final/"),
       checkpoints=req("checkpoint directory, outside Snakemake's outputs"),
       tracking_dir=opt("tensorboard/<cell> and wandb/ go here (report_to)", default="results"),
       threads=opt("CPUs of the job, shared by its processes", type=int))  # fmt: skip
def _train(args):
    from accelerate import PartialState

    from klstudy.train import cell, slices

    slices.install()  # SLURM's warning before the time limit may come at any time from now
    _threads(args.threads)
    if args.threads and os.environ.get("LOCAL_RANK", "0") == "0":  # once a node
        print(f"CPU threads per process: {threads_per_process(args.threads)} ({args.threads} CPUs over "
              f"{os.environ.get('LOCAL_WORLD_SIZE', 1)} processes on this node)", flush=True)  # fmt: skip
    paths = (args.model, args.train_data, args.heldout_data, args.out, args.checkpoints, args.tracking_dir)
    summary = cell.run(args.settings, *map(Path, paths))
    status = f"{summary['status']} after {summary['steps_done']} steps {summary['reason']}"
    PartialState().print(f"cell {args.out}: {status}")  # once, from the main process


@stage("evaluate", "mean@k of one model on some tasks with lm-eval-harness",
       model=req("model directory (a cell's final/ or a base model)"),
       task=req("klstudy tasks (src/klstudy/evaluate/tasks), e.g. math500", nargs="+"),
       data_dir=req("where the staged <task>.jsonl files are"),
       settings=as_json("the config's evaluation section"),
       chat_template=opt("prompt with the chat template", choices=("on", "off"), default="on"),
       seed=opt("the sampling seed (the cell's training seed)", type=int, default=0),
       summary=opt("the cell's summary.json (its status is copied into the row)"), **THREADS,
       out=req("per task: results JSON (lm-eval's + the tidy row)", nargs="+"),
       samples=req("per task: JSONL of every repeat and its score", nargs="+"))  # fmt: skip
def _evaluate(args):
    if not len(args.task) == len(args.out) == len(args.samples):
        raise SystemExit(f"klstudy evaluate: --task, --out and --samples name {len(args.task)}, {len(args.out)} and "
                         f"{len(args.samples)} files; give one --out and one --samples file per task")  # fmt: skip
    from klstudy import config
    from klstudy.data import staging
    from klstudy.evaluate import harness

    _threads(args.threads)
    settings = config.section_settings("evaluation", args.settings)
    chat = args.chat_template == "on"
    # lm-eval's own progress bar (requests done, rate, time left) follows in the log.
    if settings["backend"] == "vllm" and not settings["vllm"].get("max_model_len"):
        from klstudy.train import gpu_memory

        settings["vllm"]["max_model_len"] = gpu_memory.evaluation_length(
            Path(args.model), Path(args.data_dir), args.task, chat, settings["max_tokens"]
        )
    seeds = settings["seeds"] or [args.seed]  # evaluation seeds apart from training seeds, or the training seed
    print(f"lm-eval: {', '.join(args.task)} on {args.model}, k = {settings['k']}, seeds {seeds}", flush=True)
    start = time.perf_counter()
    outputs = harness.run_seeds(
        Path(args.model), args.task, Path(args.data_dir), seeds, k=settings["k"], min_p=settings["min_p"],
        max_tokens=settings["max_tokens"], chat_template=chat, backend=settings["backend"], limit=settings["limit"],
        batch_size=settings["batch_size"], backend_settings=settings[settings["backend"]],  # evaluation.hf or .vllm
    )  # fmt: skip
    print(f"lm-eval: done in {time.perf_counter() - start:.0f} s", flush=True)
    status = json.loads(Path(args.summary).read_text())["status"] if args.summary else "base"
    for task, out, samples in zip(args.task, args.out, args.samples, strict=True):
        output = outputs[task]
        row = {key: output[key] for key in ("mean_at_k", "stderr", "unread", "k")}
        row = {"task": task, **row, "chat_template": args.chat_template, "seed": args.seed, "engine_seeds": seeds,
               "cell_status": status}  # fmt: skip
        staging.write_jsonl(output.pop("samples"), Path(samples))
        Path(out).write_text(json.dumps({**row, **output}, indent=1) + "\n")
        print(json.dumps(row))


@stage("divergence", "Fig. 12: forward KL(π_ref‖π_θ) and entropy over a cell's snapshots",
       reference=req("the base model directory (π_ref)"),
       snapshots=req("the cell's snapshots/ directory (step~N/ inside)"),
       data=req("staged JSONL whose prompts are used"), settings=as_json("the config's divergence section"),
       seed=req("the cell's seed (sampling seeds follow from it)", type=int), **THREADS,
       out=req("CSV: step, forward_kl, entropy and their standard errors"))  # fmt: skip
def _divergence(args):
    import pandas as pd

    from klstudy.data import staging
    from klstudy.evaluate import divergence

    _threads(args.threads)
    section = args.settings
    # prompt_seed: the schema's default (null, the first `prompts`) where a stage run by hand leaves it out.
    prompts = divergence.chosen_prompts(staging.read_jsonl(Path(args.data)), section["prompts"],
                                        section.get("prompt_seed"))  # fmt: skip
    rows = divergence.across_snapshots(Path(args.reference), Path(args.snapshots), prompts, section, args.seed)
    table = pd.DataFrame(rows)
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))


@stage("aggregate", "tidy tables of the whole grid (results/tables/*.csv)",
       settings=as_json("the whole config (saved, validated, with the tables)"),
       results=opt("the results directory", default="results"),
       out_dir=req("where the tables go (results/tables)"))  # fmt: skip
def _aggregate(args):
    import yaml

    from klstudy.config import validate_config
    from klstudy.report import aggregate

    config = validate_config(args.settings)
    tables = aggregate.write_tables(config, Path(args.results), Path(args.out_dir))
    (Path(args.out_dir) / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    for name, table in tables.items():
        print(f"{name}: {len(table)} rows")


@stage("figure", "one of the paper's figures 2-13, as configured under 'figures'",
       name=req("a key of the config's figures section, e.g. fig02_k1_in_loss"), **VALIDATED, **TABLES,
       claims=opt("figures/claims.csv: the verdicts printed under the panels they concern"), **PNG)  # fmt: skip
def _figure(args):
    from klstudy.report import aggregate
    from klstudy.report.figures.encoding import read_claims
    from klstudy.report.figures.paper import paper_figure

    claims = read_claims(Path(args.claims)) if args.claims else None
    tables = aggregate.read_tables(Path(args.tables))
    paper_figure(args.name, read_config(args.config), tables, Path(args.out), claims)


@stage("training-figure", "a study's training reward, KL and gradient norm",
       study=req("a key of the config's studies section"), **VALIDATED, **TABLES, **PNG)  # fmt: skip
def _training_figure(args):
    from klstudy.report import aggregate
    from klstudy.report.figures.training import training_figure

    tables = aggregate.read_tables(Path(args.tables))
    training_figure(args.study, read_config(args.config), tables, Path(args.out))


@stage("claims-figure", "one metric's claims: effect ± critical·se, by verdict", claims=req("figures/claims.csv"),
       **VALIDATED, metric=opt("the claims' metric this forest draws (default: the table's first)"), **PNG)  # fmt: skip
def _claims_figure(args):
    from klstudy.report.figures.encoding import read_claims
    from klstudy.report.figures.forest import claims_forest

    claims_forest(read_claims(Path(args.claims)), read_config(args.config), Path(args.out), args.metric)


@stage("figures-readme", "figures/README.md: how to read every figure of the run", **VALIDATED,
       out=req("figures/README.md"))  # fmt: skip
def _figures_readme(args):
    from klstudy.report.figures.redraw import write_readme

    write_readme(read_config(args.config), Path(args.out))


@stage("redraw", "a shipped folder's figures from its tables/ (no training)",
       folder=opt("where the figures go, e.g. docs/embedded", positional=True),
       tables=opt("the tables (default: FOLDER/tables)"))  # fmt: skip
def _redraw(args):
    from klstudy.report.figures.redraw import redraw

    drawn = redraw(Path(args.folder), Path(args.tables) if args.tables else None)
    print(f"redrew {len(drawn)} figures in {args.folder}: {', '.join(drawn)}")


@stage("tables", "Table 1 (with the runs' behaviour), Table 2, evaluations, claims", **VALIDATED, **TABLES,
       toy_tests=req("results/toy/unbiasedness.csv"), out_dir=req("where the tables go (figures/)"))  # fmt: skip
def _tables(args):
    from klstudy.report import aggregate, tables

    aggregated = aggregate.read_tables(Path(args.tables))
    tables.write_study_tables(read_config(args.config), aggregated, Path(args.toy_tests), Path(args.out_dir))


@stage("status", "every cell's state (ok, collapsed, diverged, running, failed, missing)", **STUDY,
       format=opt("a table to read, or CSV", choices=("table", "csv"), default="table"))  # fmt: skip
def _status(args):
    from klstudy.run import status

    print(status.report(read_config(args.config), Path(args.root), args.format))


@stage("preflight", "hub access, data sources, SLURM account, partitions, time limits, GPUs, disk; GPU-hours",
       **STUDY, no_hub=opt("do not ask the hub (e.g. on a machine without network)", action="store_true"))  # fmt: skip
def _preflight(args):
    from klstudy.run import preflight

    passed, text = preflight.report(read_config(args.config), Path(args.root), hub=not args.no_hub)
    print(text)
    if not passed:
        raise SystemExit(1)


@stage("staged", "fail, naming `make stage`, if an input from the hub is not staged", **STUDY)
def _staged(args):
    from klstudy.run import preflight

    if missing := preflight.unstaged(read_config(args.config), Path(args.root)):
        raise SystemExit(
            f"klstudy: {len(missing)} input(s) from the hub not staged: {', '.join(missing)}. Compute nodes may have "
            f'no network: on the login node, run `make stage CONFIG="{" ".join(args.config)}"` first'
        )
    print("klstudy: every input from the hub is staged")
