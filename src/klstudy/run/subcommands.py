"""How a `klstudy` subcommand is declared, parsed and run: a function with the decorator ``command``, whose keywords
are its options (stages.py, toy_stages.py, cli.py), and the options and the config reading they share. Tested through
the commands: tests/test_references.py (every option has its help), test_explain.py (an exclusive group),
test_config.py (a stage's settings given by hand), test_warm.py (the stages, apart from the other commands)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def req(help: str, **keywords) -> dict:
    """A required option (add_argument's keywords)."""
    return dict(required=True, help=help, **keywords)


def opt(help: str, **keywords) -> dict:
    """An optional one; with ``positional=True`` an argument without a flag, with ``exclusive=True`` one of a group
    of which exactly one is given."""
    return dict(help=help, **keywords)


def JSON(text: str):  # noqa: N802 - argparse names the type in its refusal: "invalid JSON value"
    return json.loads(text)


def as_json(what: str) -> dict:
    return req(f"{what}, as JSON", type=JSON)


def config_files(what: str) -> dict:
    """A command's config files, read by read_config: several merge as in Snakemake."""
    help = f"{what} (default config.yaml); several are merged as Snakemake merges them"
    return opt(help, nargs="+", default=["config.yaml"])


THREADS = {"threads": opt("torch CPU threads", type=int)}
VALIDATED = {"config": req("the validated config aggregate wrote (a file)")}
TABLES = {"tables": req("the directory of the aggregated tables")}
PNG = {"out": req("PNG path (a PDF is written beside it)")}
STUDY = {"config": config_files("the study's config (e.g. config/paper.yaml)"),
         "root": opt("the workflow's working directory (where results/ is)", default=".")}  # fmt: skip


def command(registry: dict, name: str, help: str, /, **options):
    """Register the decorated function as the subcommand ``name``: each keyword is an option, ``data_dir`` the flag
    ``--data-dir`` (references.cli_page refuses one without help)."""

    def register(function):
        registry[name] = (function, help, options)
        return function

    return register


def build_parser(registry: dict, description: str) -> argparse.ArgumentParser:
    """The subcommands of ``registry`` (stages.STAGES, or cli.COMMANDS)."""
    parser = argparse.ArgumentParser(prog="klstudy", description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (function, help, options) in registry.items():
        subcommand, exclusive = commands.add_parser(name, help=help), None
        for key, keywords in options.items():
            keywords, target = dict(keywords), subcommand
            flag = key if keywords.pop("positional", False) else "--" + key.replace("_", "-")
            if keywords.pop("exclusive", False):
                exclusive = target = exclusive or subcommand.add_mutually_exclusive_group(required=True)
            target.add_argument(flag, **keywords)
        subcommand.set_defaults(run=function)
    return parser


def run(argv: list[str], parser: argparse.ArgumentParser) -> int:
    """Run the command ``argv`` names in this process; its status (stages return None, `drive` its command's)."""
    from klstudy.config import ConfigError

    args = parser.parse_args(argv)
    try:
        status = args.run(args)
    except ConfigError as error:  # settings given by hand: one line naming the key, no traceback
        raise SystemExit(f"klstudy {args.command}: {error}") from None
    return status if isinstance(status, int) else 0


def read_config(paths: str | list[str]) -> dict:
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
