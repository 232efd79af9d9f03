"""The paper's settings, line by line (config/paper-settings.yaml), checked against config/paper.yaml and written out as
docs/paper-settings.md.

`python -m klstudy paper-settings --out docs/paper-settings.md` writes the page; tests/test_paper_settings.py fails
where a row's value is not the config's, where the page is not what the mapping gives, and where a reference names a
section, figure or table the paper does not have. The mapping file's header says what a row holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from klstudy import config as configuration
from klstudy.run.config_reference import flow

MAPPING = configuration.REPO_ROOT / "config" / "paper-settings.yaml"
KINDS = {
    "stated": "the paper says it; the config holds it",
    "read": "the words allow more than one reading; the one taken, and why",
    "open": "the paper does not say; the choice, and why",
    "pending": "a known difference, not yet resolved",
}
# Each kind's table on the page: (heading, the row's field). A stated row's words are the mapping's: the page says
# where and what; an open row has no words to quote.
COLUMNS = {
    "stated": [("where", "where"), ("config", "key")],
    "open": [("where", "where"), ("config", "key"), ("the choice, and why", "reading")],
}
QUOTED = [("where", "where"), ("the paper", "paper"), ("config", "key"), ("reading", "reading")]
CLAIMS_COLUMNS = [("where", "where"), ("the paper", "paper"), ("why", "why")]
# Each entry of these lists needs these fields.
ENTRIES = {"not_settings": ("key", "why"), "claims_not_encoded": ("paper", "where", "why"),
           "claims_removed": ("claim", "why")}  # fmt: skip
MISSING = object()


# The config's sections whose every key a run of config/paper.yaml uses: each key under them is a row's (stated or
# read) or a not_settings entry's (what it is instead, and why it is no setting of the paper's study).
RUN_SECTIONS = ("studies", "evaluation", "divergence", "toy", "data")


def load(path: Path = MAPPING) -> dict:
    mapping = yaml.safe_load(Path(path).read_text())
    problems = [f"{section}[{i}] needs {', '.join(fields)}" for section, fields in ENTRIES.items()
                for i, entry in enumerate(mapping.get(section, [])) if not all(map(entry.get, fields))]  # fmt: skip
    for i, row in enumerate(mapping["settings"]):
        if row.get("kind") not in KINDS:
            problems.append(f"settings[{i}].kind must be one of {sorted(KINDS)}, not {row.get('kind')!r}")
        elif row["kind"] != "pending" and "key" in row and "value" not in row:
            problems.append(f"settings[{i}] names a key but no value")
        elif row["kind"] != "stated" and not row.get("reading"):
            problems.append(f"settings[{i}] ({row['kind']}) says no reading")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return mapping


def expand(path: str, studies=()) -> list[str]:
    """A path with ``{a,b,c}`` parts (the same setting in several studies) as its paths, ``studies.*`` as each of
    ``studies``; others as themselves."""
    if studies:
        path = path.replace("studies.*.", "studies.{" + ",".join(studies) + "}.")
    found = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", path)
    if not found:
        return [path]
    head, names, tail = found.groups()
    return [path for name in names.split(",") for path in expand(f"{head}{name.strip()}{tail}")]


def pairs(row: dict) -> list[tuple[str, object]]:
    """(key, value) pairs of a row as written: ``key`` one key and ``value`` its value, or both lists alike."""
    if "key" not in row:
        return []
    if isinstance(row["key"], str):
        return [(row["key"], row.get("value", MISSING))]
    values = row.get("value", [MISSING] * len(row["key"]))
    if len(values) != len(row["key"]):
        raise ValueError(f"paper-settings row {row['paper'][:40]!r}: {len(row['key'])} keys but {len(values)} values")
    return list(zip(row["key"], values, strict=True))


def keys_and_values(row: dict, studies=()) -> list[tuple[str, object]]:
    """(config path, value) pairs of a row, each key expanded to its paths (expand) that hold its value."""
    return [(path, value) for key, value in pairs(row) for path in expand(key, studies)]


def leaf_paths(node, prefix: str) -> list[str]:
    """The dotted paths of a config section's values (a list is one value)."""
    if not isinstance(node, dict) or not node:
        return [prefix]
    return [path for key, value in node.items() for path in leaf_paths(value, f"{prefix}.{key}")]


def _covers(pattern: str, path: str) -> bool:
    """Whether ``pattern`` (a path, ``*`` matching any one part) is ``path`` or one of its ancestors."""
    parts, wanted = path.split("."), pattern.split(".")
    return len(wanted) <= len(parts) and all(w in ("*", p) for w, p in zip(wanted, parts, strict=False))


def uncovered(config: dict, mapping: dict) -> list[str]:
    """Each path under RUN_SECTIONS of a validated config that no row (stated, read, open) nor not_settings entry
    names: a setting a run uses with neither the paper's words nor a reading."""
    studies = list(config["studies"])
    rows = [row for row in mapping["settings"] if row["kind"] != "pending"]
    named = [path for row in rows for path, _ in keys_and_values(row, studies)]
    named += [path for entry in mapping.get("not_settings", []) for path in expand(entry["key"])]
    paths = [path for section in RUN_SECTIONS for path in leaf_paths(config.get(section, {}), section)]
    return [path for path in paths if not any(_covers(pattern, path) for pattern in named)]


def mismatches(config: dict, mapping: dict) -> list[str]:
    """Each checked row's key whose config value is not the row's (a pending row's keys must only exist)."""
    found = []
    for row in mapping["settings"]:
        for path, value in keys_and_values(row, list(config["studies"])):
            held = config
            for part in path.split("."):
                held = held.get(part, MISSING) if isinstance(held, dict) else MISSING
            if held is MISSING:
                found.append(f"{path}: not in the config")
            elif row["kind"] != "pending" and held != value:
                found.append(f"{path}: the config has {held!r}, the paper's setting is {value!r} ({row['where']})")
    return found


def unknown_references(where: str, paper: dict) -> list[str]:
    """The sections, figures and tables a ``where`` (or a claim's ``paper:``) names that the paper (its sections,
    figures and tables) does not have; remarks in brackets are no references."""
    unknown, previous = [], ""
    for reference in re.split(r",\s*", re.sub(r"\s*\([^)]*\)", "", where)):
        reference = reference.removeprefix("App. ").strip()
        if re.fullmatch(r"\d+", reference) and previous.startswith("Fig"):
            reference = f"Fig. {reference}"  # "Fig. 5, 6, 10": a list of figures
        figure = re.fullmatch(r"Figs?\. (\d+)(?:[–-](\d+))?(?: (?:left|right|centre|center))?", reference)
        table = re.fullmatch(r"Table (\d+)", reference)
        if figure:
            known = all(1 <= int(n) <= paper["figures"] for n in figure.groups() if n)
        elif table:
            known = 1 <= int(table.group(1)) <= paper["tables"]
        else:
            known = reference.removeprefix("§") in paper["sections"]
        if reference and not known:
            unknown.append(reference)
        previous = reference
    return unknown


def _table(columns: list[tuple[str, str]], rows: list[dict]) -> list[str]:
    """A Markdown table of ``rows``, a (heading, field) a column; a row's ``key`` as its keys with their values."""

    def cell(row: dict, name: str) -> str:
        if name == "key":
            return "<br>".join(f"`{k}`" + ("" if v is MISSING else f" = `{flow(v)}`") for k, v in pairs(row))
        return " ".join(str(row[name]).split())

    return ["| " + " | ".join(heading for heading, _ in columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(cell(row, name) for _, name in columns) + " |" for row in rows), ""]  # fmt: skip


def page(mapping: dict) -> str:
    """docs/paper-settings.md: a table a kind of row, then the paper's claims the claims table cannot express (the keys
    that are no setting of the paper's, and the claims removed, stay in the mapping with their reasons)."""
    pending = sum(row["kind"] == "pending" for row in mapping["settings"])
    lines = [
        "# The paper's settings, line by line",
        "",
        "[← the manual](README.md) · each setting the paper states, where it says it, and the `config/paper.yaml` key "
        "that holds it.",
        "",
        "Sections (§4.1) and appendices (B, D.2) are the paper's; `studies.*` is every study of the paper's config, "
        "`{a,b}` the studies named; ω_t = π_θ / π_old is the per-token importance ratio. Written from "
        "`config/paper-settings.yaml`, which quotes the paper's words for every row, by "
        "`.venv/bin/python -m klstudy paper-settings --out docs/paper-settings.md`.",
        "",
        f"**{pending} known difference{'s are' if pending != 1 else ' is'} not yet resolved**: the last table. Every "
        "other row is what `config/paper.yaml` runs." if pending else
        "Every row is what `config/paper.yaml` runs; where its runs still differ: [differences](differences.md).",
        "",
    ]  # fmt: skip
    for kind, heading in KINDS.items():
        if rows := [row for row in mapping["settings"] if row["kind"] == kind]:
            lines += [f"## {heading[0].upper()}{heading[1:]}", "", *_table(COLUMNS.get(kind, QUOTED), rows)]
    lines += ["## The paper's claims no claim expresses", "",
              "The paper's claims [the claims table](claims.md) cannot judge, and why (every other key a run reads, "
              "and why it is no setting of the paper's: `not_settings` in `config/paper-settings.yaml`):", "",
              *_table(CLAIMS_COLUMNS, mapping["claims_not_encoded"])]  # fmt: skip
    return "\n".join(lines[:-1])  # the page ends with its last row
