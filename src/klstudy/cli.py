"""`klstudy` command line: the pipeline's stages (stages.py) and the warm server that can run them (warm.py).

Every stage can be run (and debugged) without Snakemake; the rules only wire paths together. ``python -m klstudy
<stage>`` runs the stage in the warm server when one serves this job, else in this process. The imports go one way:
cli imports stages and warm, warm imports stages, stages imports neither.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from klstudy import stages


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klstudy", description=stages.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    stages.add_commands(commands)
    warm_ = commands.add_parser(
        "warm", help="run a command (e.g. snakemake) with a warm server that runs every klstudy job it starts (warm.py)"
    )
    warm_.add_argument("--log", default="logs/warm.log", help="the server's own output")
    warm_.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    warm_.set_defaults(run=_warm)
    serve = commands.add_parser("warm-serve", help="the warm server itself (started by `warm`)")
    serve.add_argument("--socket", required=True, help="the Unix socket to serve")
    serve.set_defaults(run=_warm_serve)
    return parser


def _warm(args) -> int:
    from klstudy import warm

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("klstudy warm: give the command to run after --")
    return warm.run_with_server(command, Path(args.log))


def _warm_serve(args) -> None:
    from klstudy import warm

    warm.serve(args.socket)


def run(argv: list[str]) -> int:
    """Run the command ``argv`` names in this process; `warm` returns its command's exit status, a stage 0."""
    return stages.run(argv, build_parser())


def main(argv=None) -> int:
    """``python -m klstudy``: the stage runs in the warm server when one serves this job (warm.py), else here."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] not in (["warm"], ["warm-serve"]):
        from klstudy import warm

        status = warm.delegate(argv)
        if status is not None:
            return status
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
