"""The pipeline's stages as `klstudy` subcommands: one per stage, each called by one Snakemake rule.

Every stage can be run (and debugged) without Snakemake; the rules only wire paths together. One convention hands
settings to a stage: ``--settings`` is the part of the validated config the stage reads, as JSON (a dataset's entry,
the toy section, a cell's settings from ``config.cell_settings``, the evaluation or divergence section); stages that
read the whole config take it as a file path (``--config``). Defaults live in the schema alone. Each stage imports
what it needs inside its function: every job is a process of its own, and start-up is a large part of a small one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from klstudy.run import toy_stages
from klstudy.run.devices import threads as _threads
from klstudy.run.devices import threads_per_process


def _prepare_data(args):
    from klstudy import config
    from klstudy.data import staging

    records = staging.prepare(args.name, config.dataset_settings(args.name, json.loads(args.settings)), Path(args.out))
    print(f"dataset {args.name}: {len(records)} records -> {args.out}")


def _base_model(args):
    from klstudy.train import models

    _threads(args.threads)
    models.build_base_model(args.name, json.loads(args.settings), args.warm_start_data, Path(args.out))


def _pin_base_model(args):
    """Build an embedded model afresh on this machine, from its config's warm-start data, into its ``pinned.path``
    (or ``--out``): the way to make the repository's pinned copy after changing its spec or its data."""
    import tempfile

    from klstudy import config
    from klstudy.data import staging
    from klstudy.train import models

    _threads(args.threads)
    settings = _read_config(args.configfile)
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


def _train(args):
    from accelerate import PartialState

    from klstudy.train import cell, slices

    slices.install()  # SLURM's warning before the time limit may come at any time from now
    _threads(args.threads)
    if args.threads and os.environ.get("LOCAL_RANK", "0") == "0":  # once a node
        print(f"CPU threads per process: {threads_per_process(args.threads)} ({args.threads} CPUs over "
              f"{os.environ.get('LOCAL_WORLD_SIZE', 1)} processes on this node)", flush=True)  # fmt: skip
    summary = cell.run(
        json.loads(args.settings),
        Path(args.model),
        Path(args.train_data),
        Path(args.heldout_data),
        Path(args.out),
        Path(args.checkpoints),
        Path(args.tracking_dir),
    )
    status = f"{summary['status']} after {summary['steps_done']} steps {summary['reason']}"
    PartialState().print(f"cell {args.out}: {status}")  # once, from the main process


def _evaluate(args):
    if not len(args.task) == len(args.out) == len(args.samples):
        raise SystemExit(f"klstudy evaluate: --task, --out and --samples name {len(args.task)}, {len(args.out)} and "
                         f"{len(args.samples)} files; give one --out and one --samples file per task")  # fmt: skip
    from klstudy import config
    from klstudy.data import staging
    from klstudy.evaluate import harness

    _threads(args.threads)
    settings = config.section_settings("evaluation", json.loads(args.settings))
    # lm-eval's own progress bar (requests done, rate, time left) follows in the log.
    if settings["backend"] == "vllm" and not settings["vllm"].get("max_model_len"):
        from klstudy.train import gpu_memory

        settings["vllm"]["max_model_len"] = gpu_memory.evaluation_length(
            Path(args.model), Path(args.data_dir), args.task, args.chat_template == "on", settings["max_tokens"]
        )
    seeds = settings["seeds"] or [args.seed]  # evaluation seeds apart from training seeds, or the training seed
    print(f"lm-eval: {', '.join(args.task)} on {args.model}, k = {settings['k']}, seeds {seeds}", flush=True)
    start = time.perf_counter()
    outputs = harness.run_seeds(
        Path(args.model), args.task, Path(args.data_dir), seeds, k=settings["k"], min_p=settings["min_p"],
        max_tokens=settings["max_tokens"], chat_template=args.chat_template == "on", backend=settings["backend"],
        limit=settings["limit"], batch_size=settings["batch_size"],
        backend_settings=settings[settings["backend"]],  # evaluation.hf or evaluation.vllm
    )  # fmt: skip
    print(f"lm-eval: done in {time.perf_counter() - start:.0f} s", flush=True)
    status = json.loads(Path(args.summary).read_text())["status"] if args.summary else "base"
    for task, out, samples in zip(args.task, args.out, args.samples, strict=True):
        output = outputs[task]
        row = {"task": task, "mean_at_k": output["mean_at_k"], "stderr": output["stderr"], "unread": output["unread"],
               "k": output["k"],
               "chat_template": args.chat_template, "seed": args.seed, "engine_seeds": seeds,
               "cell_status": status}  # fmt: skip
        staging.write_jsonl(output.pop("samples"), Path(samples))
        Path(out).write_text(json.dumps({**row, **output}, indent=1) + "\n")
        print(json.dumps(row))


def _divergence(args):
    import pandas as pd

    from klstudy.data import staging
    from klstudy.evaluate import divergence

    _threads(args.threads)
    section = json.loads(args.settings)
    # prompt_seed: the schema's default (null, the first `prompts`) where a stage run by hand leaves it out.
    seed = section.get("prompt_seed")
    prompts = divergence.chosen_prompts(staging.read_jsonl(Path(args.data)), section["prompts"], seed)
    rows = divergence.across_snapshots(Path(args.reference), Path(args.snapshots), prompts, section, args.seed)
    table = pd.DataFrame(rows)
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))


def _read_config(paths: str | list[str]) -> dict:
    """Config files (the user's, or the validated one aggregate writes beside the tables), validated. Several are
    merged in order as ``snakemake --configfile A B`` merges them (B's mappings into A's, key by key; B's lists
    replace A's), with Snakemake's own function, so that an overlay (config/separation.yaml) reads the same here."""
    import yaml
    from snakemake.utils import update_config

    from klstudy.config import validate_config

    merged: dict = {}
    for path in [paths] if isinstance(paths, str) else paths:
        update_config(merged, yaml.safe_load(Path(path).read_text()))
    return validate_config(merged)


def _aggregate(args):
    import yaml

    from klstudy.config import validate_config
    from klstudy.report import aggregate

    config = validate_config(json.loads(args.settings))
    tables = aggregate.write_tables(config, Path(args.results), Path(args.out_dir))
    (Path(args.out_dir) / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    for name, table in tables.items():
        print(f"{name}: {len(table)} rows")


def _figure(args):
    from klstudy.report import aggregate
    from klstudy.report.figures.encoding import read_claims
    from klstudy.report.figures.paper import paper_figure

    config = _read_config(args.config)
    tables = aggregate.read_tables(Path(args.tables))
    claims = read_claims(Path(args.claims)) if args.claims else None
    paper_figure(args.name, config, tables, Path(args.out), claims)


def _training_figure(args):
    from klstudy.report import aggregate
    from klstudy.report.figures.training import training_figure

    config = _read_config(args.config)
    training_figure(args.study, config, aggregate.read_tables(Path(args.tables)), Path(args.out))


def _claims_figure(args):
    from klstudy.report.figures.encoding import read_claims
    from klstudy.report.figures.forest import claims_forest

    claims_forest(read_claims(Path(args.claims)), _read_config(args.config), Path(args.out), args.metric)


def _figures_readme(args):
    from klstudy.report.figures.redraw import write_readme

    write_readme(_read_config(args.config), Path(args.out))


def _redraw(args):
    from klstudy.report.figures.redraw import redraw

    drawn = redraw(Path(args.folder), Path(args.tables) if args.tables else None)
    print(f"redrew {len(drawn)} figures in {args.folder}: {', '.join(drawn)}")


def _tables(args):
    from klstudy.report import aggregate, tables

    config = _read_config(args.config)
    aggregated = aggregate.read_tables(Path(args.tables))
    tables.write_study_tables(config, aggregated, Path(args.toy_tests), Path(args.out_dir))


def _status(args):
    from klstudy.run import status

    rows = status.grid_status(_read_config(args.config), Path(args.root))
    print(status.format_csv(rows) if args.format == "csv" else status.format_table(rows), end="")
    print("" if args.format == "csv" else "\n", end="")


def _preflight(args):
    from klstudy.run import preflight

    passed, text = preflight.report(_read_config(args.config), Path(args.root), hub=not args.no_hub)
    print(text)
    if not passed:
        raise SystemExit(1)


def _staged(args):
    from klstudy.run import preflight

    missing = preflight.unstaged(_read_config(args.config), Path(args.root))
    if missing:
        configs = " ".join(args.config)
        raise SystemExit(
            f"klstudy: {len(missing)} input(s) from the hub not staged: {', '.join(missing)}. Compute nodes may have "
            f'no network: on the login node, run `make stage CONFIG="{configs}"` first'
        )
    print("klstudy: every input from the hub is staged")


def _config_files_option(parser, flag: str, what: str) -> None:
    """A command's config files (default config.yaml), read by _read_config: several merge as in Snakemake."""
    help_text = f"{what} (default config.yaml); several are merged as Snakemake merges them"
    parser.add_argument(flag, nargs="+", default=["config.yaml"], help=help_text)


def build_parser() -> argparse.ArgumentParser:
    """The stages alone (cli.build_parser adds the warm server's commands)."""
    parser = argparse.ArgumentParser(prog="klstudy", description=__doc__)
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def add_commands(commands) -> None:
    """One subcommand per stage on ``commands`` (an argparse subparsers action)."""
    toy_stages.add_commands(commands)  # the §3 analysis: the toy model, its fixed points, the atlas

    prepare = commands.add_parser("prepare-data", help="stage one dataset as JSONL in the common schema")
    prepare.add_argument("--name", required=True, help="the dataset's name under 'data'")
    prepare.add_argument("--settings", required=True, help="the dataset's config entry, as JSON")
    prepare.add_argument("--out", required=True, help="the staged JSONL (a .check.json is written beside it)")
    prepare.set_defaults(run=_prepare_data)

    base = commands.add_parser("base-model", help="build the tiny model, or stage a hub model, in HF format")
    base.add_argument("--name", required=True, help="the model's alias under 'models'")
    base.add_argument("--settings", required=True, help="the model's config entry, as JSON")
    base.add_argument("--warm-start-data", nargs="*", default=[], help="staged JSONL files (embedded models)")
    base.add_argument("--threads", type=int, help="torch CPU threads")
    base.add_argument("--out", required=True, help="the model directory (Hugging Face format)")
    base.set_defaults(run=_base_model)

    pin = commands.add_parser("pin-base-model", help="build an embedded base model as its pinned copy")
    _config_files_option(pin, "--configfile", "the config naming the model")
    pin.add_argument("--model", required=True, help="the model's alias under 'models'")
    pin.add_argument("--out", help="where to write it (default: the model's pinned.path)")
    pin.add_argument("--threads", type=int, help="torch CPU threads")
    pin.set_defaults(run=_pin_base_model)

    train = commands.add_parser("train", help="RL-train one grid cell (resumes from its last checkpoint)")
    train.add_argument("--settings", required=True, help="the cell's settings (config.cell_settings), as JSON")
    train.add_argument("--model", required=True, help="base model directory (Hugging Face format)")
    train.add_argument("--train-data", required=True, help="staged JSONL of the training prompts")
    train.add_argument("--heldout-data", required=True, help="staged JSONL of the held-out questions (pass@1)")
    train.add_argument(
        "--out", required=True, help="cell directory: metrics.jsonl, heldout.jsonl, summary.json, final/"
    )
    train.add_argument("--checkpoints", required=True, help="checkpoint directory, outside Snakemake's outputs")
    train.add_argument("--tracking-dir", default="results", help="tensorboard/<cell> and wandb/ go here (report_to)")
    train.add_argument("--threads", type=int, help="CPUs of the job, shared by its processes")
    train.set_defaults(run=_train)

    evaluate = commands.add_parser("evaluate", help="mean@k of one model on some tasks with lm-eval-harness")
    evaluate.add_argument("--model", required=True, help="model directory (a cell's final/ or a base model)")
    evaluate.add_argument(
        "--task", required=True, nargs="+", help="klstudy tasks (src/klstudy/evaluate/tasks), e.g. math500"
    )
    evaluate.add_argument("--data-dir", required=True, help="where the staged <task>.jsonl files are")
    evaluate.add_argument("--settings", required=True, help="the config's evaluation section, as JSON")
    evaluate.add_argument("--chat-template", choices=("on", "off"), default="on", help="prompt with the chat template")
    evaluate.add_argument("--seed", type=int, default=0, help="the sampling seed (the cell's training seed)")
    evaluate.add_argument("--summary", help="the cell's summary.json (its status is copied into the row)")
    evaluate.add_argument("--threads", type=int, help="torch CPU threads")
    evaluate.add_argument("--out", required=True, nargs="+", help="per task: results JSON (lm-eval's + the tidy row)")
    evaluate.add_argument("--samples", required=True, nargs="+", help="per task: JSONL of every repeat and its score")
    evaluate.set_defaults(run=_evaluate)

    div = commands.add_parser("divergence", help="Fig. 12: forward KL(π_ref‖π_θ) and entropy over a cell's snapshots")
    div.add_argument("--reference", required=True, help="the base model directory (π_ref)")
    div.add_argument("--snapshots", required=True, help="the cell's snapshots/ directory (step~N/ inside)")
    div.add_argument("--data", required=True, help="staged JSONL whose prompts are used")
    div.add_argument("--settings", required=True, help="the config's divergence section, as JSON")
    div.add_argument("--seed", type=int, required=True, help="the cell's seed (sampling seeds follow from it)")
    div.add_argument("--threads", type=int, help="torch CPU threads")
    div.add_argument("--out", required=True, help="CSV: step, forward_kl, entropy and their standard errors")
    div.set_defaults(run=_divergence)

    agg = commands.add_parser("aggregate", help="tidy tables of the whole grid (results/tables/*.csv)")
    agg.add_argument("--settings", required=True, help="the whole config, as JSON (saved, validated, with the tables)")
    agg.add_argument("--results", default="results", help="the results directory")
    agg.add_argument("--out-dir", required=True, help="where the tables go (results/tables)")
    agg.set_defaults(run=_aggregate)

    fig = commands.add_parser("figure", help="one of the paper's figures 2-13, as configured under 'figures'")
    fig.add_argument("--name", required=True, help="a key of the config's figures section, e.g. fig02_k1_in_loss")
    fig.add_argument("--config", required=True, help="the validated config aggregate wrote (a file)")
    fig.add_argument("--tables", required=True, help="the directory of the aggregated tables")
    fig.add_argument("--claims", help="figures/claims.csv: the verdicts printed under the panels they concern")
    fig.add_argument("--out", required=True, help="PNG path (a PDF is written beside it)")
    fig.set_defaults(run=_figure)

    train_fig = commands.add_parser("training-figure", help="a study's training reward, KL and gradient norm")
    train_fig.add_argument("--study", required=True, help="a key of the config's studies section")
    train_fig.add_argument("--config", required=True, help="the validated config aggregate wrote (a file)")
    train_fig.add_argument("--tables", required=True, help="the directory of the aggregated tables")
    train_fig.add_argument("--out", required=True, help="PNG path (a PDF is written beside it)")
    train_fig.set_defaults(run=_training_figure)

    claims_fig = commands.add_parser("claims-figure", help="one metric's claims: effect ± critical·se, by verdict")
    claims_fig.add_argument("--claims", required=True, help="figures/claims.csv")
    claims_fig.add_argument("--config", required=True, help="the validated config aggregate wrote (a file)")
    claims_fig.add_argument("--metric", help="the claims' metric this forest draws (default: the table's first)")
    claims_fig.add_argument("--out", required=True, help="PNG path (a PDF is written beside it)")
    claims_fig.set_defaults(run=_claims_figure)

    readme = commands.add_parser("figures-readme", help="figures/README.md: how to read every figure of the run")
    readme.add_argument("--config", required=True, help="the validated config aggregate wrote (a file)")
    readme.add_argument("--out", required=True, help="figures/README.md")
    readme.set_defaults(run=_figures_readme)

    again = commands.add_parser("redraw", help="a shipped folder's figures from its tables/ (no training)")
    again.add_argument("folder", help="where the figures go, e.g. docs/embedded")
    again.add_argument("--tables", help="the tables (default: FOLDER/tables)")
    again.set_defaults(run=_redraw)

    tab = commands.add_parser("tables", help="Table 1 (with the runs' behaviour), Table 2, evaluations, claims")
    tab.add_argument("--config", required=True, help="the validated config aggregate wrote (a file)")
    tab.add_argument("--tables", required=True, help="the directory of the aggregated tables")
    tab.add_argument("--toy-tests", required=True, help="results/toy/unbiasedness.csv")
    tab.add_argument("--out-dir", required=True, help="where the tables go (figures/)")
    tab.set_defaults(run=_tables)

    stat = commands.add_parser("status", help="every cell's state (ok, collapsed, diverged, running, failed, missing)")
    _config_files_option(stat, "--config", "the study's config (e.g. config/paper.yaml)")
    stat.add_argument("--root", default=".", help="the workflow's working directory (results/ and logs/ inside)")
    stat.add_argument("--format", choices=("table", "csv"), default="table", help="a table to read, or CSV")
    stat.set_defaults(run=_status)

    pre = commands.add_parser(
        "preflight", help="hub access, data sources, SLURM account, partitions, time limits, GPUs, disk; GPU-hours"
    )
    _config_files_option(pre, "--config", "the study's config (e.g. config/paper.yaml)")
    pre.add_argument("--root", default=".", help="the workflow's working directory (results/ inside)")
    pre.add_argument("--no-hub", action="store_true", help="do not ask the hub (e.g. on a machine without network)")
    pre.set_defaults(run=_preflight)

    staged = commands.add_parser("staged", help="fail, naming `make stage`, if an input from the hub is not staged")
    _config_files_option(staged, "--config", "the study's config (e.g. config/paper.yaml)")
    staged.add_argument("--root", default=".", help="the workflow's working directory (results/ inside)")
    staged.set_defaults(run=_staged)


def run(argv: list[str], parser: argparse.ArgumentParser | None = None) -> int:
    """Run the command ``argv`` names (a stage, or one of ``parser``'s) in this process."""
    from klstudy.config import ConfigError

    args = (parser or build_parser()).parse_args(argv)
    try:
        status = args.run(args)  # stages return None; `drive` returns its command's exit status
    except ConfigError as error:  # settings given by hand: one line naming the key, no traceback
        raise SystemExit(f"klstudy {args.command}: {error}") from None
    return status if isinstance(status, int) else 0
