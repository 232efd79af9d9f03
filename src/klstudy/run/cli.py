"""`klstudy` command line: the stages (stages.py), the study's driver (drive.py), the warm server (warm.py), a
training job's last failure (failures.py), the pilot and the generated pages. ``python -m klstudy <stage>`` runs the
stage in the warm server when one serves this job, else here. The imports go one way: cli imports stages, drive and
warm; drive imports warm; warm imports stages.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from klstudy.analysis.explain import RANGE_BETAS  # no torch: explain imports it when it computes
from klstudy.run import stages


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klstudy", description=stages.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    stages.add_commands(commands)
    drive = commands.add_parser(
        "drive", help="run snakemake so that, interrupted at any moment, the same command resumes it (drive.py)"
    )
    drive.add_argument("--warm", action="store_true", help="run every klstudy job in a warm server (warm.py)")
    drive.add_argument("--warm-log", default="logs/warm.log", help="the warm server's own output")
    drive.add_argument(
        "--gpus", help="one machine's GPUs to share, each job on its own (drive.visible_gpus): ids (0,1,3), all or auto"
    )
    drive.add_argument("command", nargs=argparse.REMAINDER, help="-- then the snakemake command")
    drive.set_defaults(run=_drive)
    serve = commands.add_parser("warm-serve", help="the warm server itself (started by `drive --warm`)")
    serve.add_argument("--socket", required=True, help="the Unix socket to serve")
    serve.set_defaults(run=_warm_serve)
    reference = commands.add_parser(
        "config-reference", help="the configuration reference (config/README.md), written from the schema"
    )
    reference.add_argument("--out", help="write it to this file (default: print it)")
    reference.set_defaults(run=_config_reference)
    generated = commands.add_parser(
        "references", help="the references written from the code: the subcommands, KLTrainerConfig, make, the "
        "environment variables (references.py)",
    )  # fmt: skip
    generated.add_argument("--out-dir", default="docs", help="the directory the five pages are written to")
    generated.set_defaults(run=_references)
    failure = commands.add_parser(
        "last-failure", help="what ended a training cell's last attempt, and what its retry does (failures.py)"
    )
    failure.add_argument("--history", required=True, help="the cell's logs/attempts/train/<cell>.log")
    failure.add_argument("--max-attempts", type=int, help="cluster.max_attempts: say so when the cell has had them")
    failure.set_defaults(run=_last_failure)
    calibration = commands.add_parser(
        "calibrate", help="the grid's GPU-hours per study at the step times a finished pilot measured (pilot.py)"
    )
    calibration.add_argument("--config", default="config/paper.yaml", help="the grid to price")
    calibration.add_argument("--pilot", default="config/pilot-7b.yaml", help="the pilot's config (its model sizes)")
    calibration.add_argument("--results", default="results", help="the pilot's results directory (runs/ inside)")
    calibration.set_defaults(run=_calibrate)
    pilot_config = commands.add_parser("pilot-config", help="config/pilot-7b.yaml, derived from config/paper.yaml")
    pilot_config.add_argument("--out", help="write it to this file (default: print it)")
    pilot_config.set_defaults(run=_pilot_config)
    settings = commands.add_parser(
        "paper-settings", help="the paper's settings against config/paper.yaml (docs/paper-settings.md)"
    )
    settings.add_argument("--out", help="write the page to this file (default: print it)")
    settings.set_defaults(run=_paper_settings)
    explaining = commands.add_parser(
        "explain", help="what a framework's KL setup, or any setting, optimises in the toy model, computed (explain.py)"
    )
    chosen = explaining.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--preset", help="a framework preset by name (src/klstudy/frameworks.py)")
    chosen.add_argument(
        "--framework", help="a framework (TRL, verl, OpenRLHF, ...): with --version, its default and its other presets"
    )
    chosen.add_argument(
        "--kl", help="a KL configuration in kl.py's grammar (k3-loss, k1-advantage, k3-loss-ratio, ...)"
    )
    explaining.add_argument("--version", help="the framework's version (with --framework), e.g. 1.12.0")
    explaining.add_argument("--normalisation", default="rloo", help="with --kl: the advantage (kl.ADVANTAGES)")
    explaining.add_argument("--group", type=int, help="G, responses per prompt (with --kl: default 8)")
    explaining.add_argument("--clamp", type=float, help="with --kl: the estimator's value clamped at ±this")
    explaining.add_argument("--on", help="with --kl: the framework whose other options to look among")
    explaining.add_argument("--beta", type=float, help="β (default: the preset's or the setting's own; --kl: 0.1)")
    explaining.add_argument(
        "--range", type=float, nargs="+", default=list(RANGE_BETAS), help="the β it is computed at besides"
    )
    explaining.add_argument("--config", default="config.yaml", help="the config whose toy section it computes in")
    explaining.add_argument(
        "settings", nargs="*", default=[], metavar="SETTING",
        help="with --framework, after --: your setting in its own words (verl's key=value, TRL's GRPOConfig "
        "field=value, OpenRLHF's and slime's flags; framework_settings.py)",
    )  # fmt: skip
    explaining.set_defaults(run=_explain)
    return parser


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


def _warm_serve(args) -> None:
    from klstudy.run import warm

    warm.serve(args.socket)


def _calibrate(args) -> None:
    import yaml

    from klstudy.config import validate_config
    from klstudy.run import pilot

    grid, tried = (validate_config(yaml.safe_load(Path(path).read_text())) for path in (args.config, args.pilot))
    print("\n".join(pilot.calibrate(grid, tried, Path(args.results))))


def _write(out: str | None, text: str) -> None:
    """A generated page or config: to ``--out``, or printed."""
    if out:
        Path(out).write_text(text)
    else:
        sys.stdout.write(text)


def _pilot_config(args) -> None:
    from klstudy.run import pilot

    _write(args.out, pilot.config_text(pilot.pilot_7b(pilot.paper_config())))


def _last_failure(args) -> None:
    from klstudy.run import failures

    print(failures.report(Path(args.history), args.max_attempts or 0))


def _config_reference(args) -> None:
    from klstudy.run import config_reference

    _write(args.out, config_reference.reference())


def _references(args) -> None:
    from klstudy.run import references

    for path in references.write(Path(args.out_dir), build_parser()):
        print(f"wrote {path}")


def _paper_settings(args) -> None:
    from klstudy.run import paper_settings

    _write(args.out, paper_settings.page(paper_settings.load()))


def _explain(args) -> None:
    import yaml

    from klstudy.analysis import explain
    from klstudy.config import validate_config

    config = None if args.config == "config.yaml" else args.config  # what the commands it prints repeat
    try:
        if args.settings and not args.framework:
            raise ValueError(f"settings {args.settings} need --framework and --version")
        if args.kl:
            beta = 0.1 if args.beta is None else args.beta
            group = 8 if args.group is None else args.group
            spec = explain.Setting(args.kl, args.normalisation, group, beta, args.clamp, args.on)
            explain.Setting.check(spec)
            compute = lambda toy: explain.explain(spec, toy, args.range, config)  # noqa: E731
        elif args.framework:
            if not args.version:
                raise ValueError("--framework needs --version")
            release = explain.resolve_release(
                args.framework, args.version, args.beta, args.settings, args.group, config
            )  # a clear error before anything is computed
            compute = lambda toy: explain.explain_release(release, toy, args.range, config)  # noqa: E731
        else:
            spec = explain.Setting.of_preset(args.preset, args.beta)
            compute = lambda toy: explain.explain(spec, toy, args.range, config)  # noqa: E731
    except ValueError as error:
        raise SystemExit(f"klstudy explain: {error}") from None
    toy = validate_config(yaml.safe_load(Path(args.config).read_text()))["toy"]
    import torch

    torch.set_num_threads(1)  # the toy's tensors are tiny: one thread, as the workflow's toy jobs (--threads 1)
    print(compute(toy))


def run(argv: list[str]) -> int:
    """Run the command ``argv`` names in this process; `drive` returns its command's exit status, a stage 0."""
    return stages.run(argv, build_parser())


def is_stage(argv: list[str]) -> bool:
    """Whether ``argv`` names a stage (stages.py), which a warm server can run; the other commands run here."""
    commands = argparse.ArgumentParser().add_subparsers()
    stages.add_commands(commands)
    return bool(argv) and argv[0] in commands.choices


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
