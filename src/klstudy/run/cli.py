"""`klstudy` command line: the stages (stages.py), the study's driver (drive.py), the warm server (warm.py), a
training job's last failure (failures.py), the pilot and the generated pages. ``python -m klstudy <stage>`` runs the
stage in the warm server when one serves this job, else here. The imports go one way: cli imports stages, drive and
warm; drive imports warm; warm imports stages.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from pathlib import Path

from klstudy.analysis.explain import RANGE_BETAS  # no torch: explain imports it when it computes
from klstudy.run import stages, subcommands
from klstudy.run.subcommands import opt, req

COMMANDS = dict(stages.STAGES)  # the stages, then the commands below, which run here, never in a warm server
command = functools.partial(subcommands.command, COMMANDS)


@command("drive", "run snakemake so that, interrupted at any moment, the same command resumes it (drive.py)",
         warm=opt("run every klstudy job in a warm server (warm.py)", action="store_true"),
         warm_log=opt("the warm server's own output", default="logs/warm.log"),
         gpus=opt("one machine's GPUs to share, each job on its own (drive.visible_gpus): ids (0,1,3), all or auto"),
         command=opt("-- then the snakemake command", positional=True, nargs=argparse.REMAINDER))  # fmt: skip
def _drive(args) -> int:
    from klstudy.run import drive

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("klstudy drive: give the snakemake command to run after --")
    try:
        status = drive.drive(command, Path(args.warm_log) if args.warm else None, args.gpus)
    except ValueError as error:  # --gpus with a device named twice
        raise SystemExit(f"klstudy drive: {error}") from None
    return 128 - status if status < 0 else status  # killed by signal N: 128 + N, as a shell reports it


@command("warm-serve", "the warm server itself (started by `drive --warm`)", socket=req("the Unix socket to serve"))
def _warm_serve(args) -> None:
    from klstudy.run import warm

    warm.serve(args.socket)


PAGES = {  # generated pages and configs, written to --out or printed: help, module, the module's text
    "config-reference": ("the configuration reference (config/README.md), written from the schema",
                         "config_reference", lambda module: module.reference()),
    "pilot-config": ("config/pilot-7b.yaml, derived from config/paper.yaml",
                     "pilot", lambda module: module.config_text(module.pilot_7b(module.paper_config()))),
    "paper-settings": ("the paper's settings against config/paper.yaml (docs/paper-settings.md)",
                       "paper_settings", lambda module: module.page(module.load())),
}  # fmt: skip


def _page(args) -> None:
    _, module, text = PAGES[args.command]
    page = text(importlib.import_module(f"klstudy.run.{module}"))
    if args.out:
        Path(args.out).write_text(page)
    else:
        sys.stdout.write(page)


for _name, (_help, *_) in PAGES.items():
    command(_name, _help, out=opt("write it to this file (default: print it)"))(_page)


@command("references", "the references written from the code: the subcommands, KLTrainerConfig, make, the "
         "environment variables (references.py)",
         out_dir=opt("the directory the five pages are written to", default="docs"))  # fmt: skip
def _references(args) -> None:
    from klstudy.run import references

    for path in references.write(Path(args.out_dir), build_parser()):
        print(f"wrote {path}")


@command("last-failure", "what ended a training cell's last attempt, and what its retry does (failures.py)",
         history=req("the cell's logs/attempts/train/<cell>.log"),
         max_attempts=opt("cluster.max_attempts: say so when the cell has had them", type=int))  # fmt: skip
def _last_failure(args) -> None:
    from klstudy.run import failures

    print(failures.report(Path(args.history), args.max_attempts or 0))


@command("calibrate", "the grid's GPU-hours per study at the step times a finished pilot measured (pilot.py)",
         config=opt("the grid to price", default="config/paper.yaml"),
         pilot=opt("the pilot's config (its model sizes)", default="config/pilot-7b.yaml"),
         results=opt("the pilot's results directory (runs/ inside)", default="results"))  # fmt: skip
def _calibrate(args) -> None:
    from klstudy.run import pilot

    grid, tried = (subcommands.read_config(path) for path in (args.config, args.pilot))
    print("\n".join(pilot.calibrate(grid, tried, Path(args.results))))


@command("explain", "what a framework's KL setup, or any setting, optimises in the toy model, computed (explain.py)",
         preset=opt("a framework preset by name (src/klstudy/frameworks.py)", exclusive=True),
         framework=opt("a framework (TRL, verl, OpenRLHF, ...): with --version, its default and its other presets",
                       exclusive=True),
         kl=opt("a KL configuration in kl.py's grammar (k3-loss, k1-advantage, k3-loss-ratio, ...)", exclusive=True),
         version=opt("the framework's version (with --framework), e.g. 1.12.0"),
         normalisation=opt("with --kl: the advantage (kl.ADVANTAGES)", default="rloo"),
         group=opt("G, responses per prompt (with --kl: default 8)", type=int),
         clamp=opt("with --kl: the estimator's value clamped at ±this", type=float),
         on=opt("with --kl: the framework whose other options to look among"),
         beta=opt("β (default: the preset's or the setting's own; --kl: 0.1)", type=float),
         range=opt("the β it is computed at besides", type=float, nargs="+", default=list(RANGE_BETAS)),
         config=opt("the config whose toy section it computes in", default="config.yaml"),
         settings=opt("with --framework, after --: your setting in its own words (verl's key=value, TRL's GRPOConfig "
                      "field=value, OpenRLHF's and slime's flags; framework_settings.py)",
                      positional=True, nargs="*", default=[], metavar="SETTING"))  # fmt: skip
def _explain(args) -> None:
    import yaml

    from klstudy.analysis import explain
    from klstudy.config import validate_config

    config = None if args.config == "config.yaml" else args.config  # what the commands it prints repeat
    try:
        if args.settings and not args.framework:
            raise ValueError(f"settings {args.settings} need --framework and --version")
        if args.framework and not args.version:
            raise ValueError("--framework needs --version")
        if args.framework:  # resolved here: a clear error before anything is computed
            release = explain.resolve_release(args.framework, args.version, args.beta, args.settings, args.group,
                                              config)  # fmt: skip
        elif args.kl:
            group, beta = 8 if args.group is None else args.group, 0.1 if args.beta is None else args.beta
            spec = explain.Setting(args.kl, args.normalisation, group, beta, args.clamp, args.on)
            explain.Setting.check(spec)
        else:
            spec = explain.Setting.of_preset(args.preset, args.beta)
    except ValueError as error:
        raise SystemExit(f"klstudy explain: {error}") from None
    if not Path(args.config).is_file():  # the toy's settings are the config's: say where it was looked for
        raise SystemExit(f"klstudy explain: no {args.config} here: run it in the repository's root, or give --config")
    toy = validate_config(yaml.safe_load(Path(args.config).read_text()))["toy"]
    import torch

    torch.set_num_threads(1)  # the toy's tensors are tiny: one thread, as the workflow's toy jobs (--threads 1)
    if args.framework:
        print(explain.explain_release(release, toy, args.range, config))
    else:
        print(explain.explain(spec, toy, args.range, config))


def build_parser() -> argparse.ArgumentParser:
    return subcommands.build_parser(COMMANDS, stages.__doc__)


def run(argv: list[str]) -> int:
    """Run the command ``argv`` names in this process; `drive` returns its command's exit status, a stage 0."""
    return subcommands.run(argv, build_parser())


def is_stage(argv: list[str]) -> bool:
    """Whether ``argv`` names a stage (stages.py), which a warm server can run; the other commands run here."""
    return bool(argv) and argv[0] in stages.STAGES


def main(argv=None) -> int:
    """``python -m klstudy``: a stage runs in the warm server when one serves this job (warm.py), else here."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if is_stage(argv):
        from klstudy.run import warm

        status = warm.delegate(argv)
        if status is not None:
            return status
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
