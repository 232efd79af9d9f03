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

MAPPING = configuration.REPO_ROOT / "config" / "paper-settings.yaml"
KINDS = {
    "stated": "the paper says it; the config holds it",
    "read": "the words allow more than one reading; the one taken, and why",
    "open": "the paper does not say; the choice, and why",
    "pending": "a known difference, not yet resolved",
}
MISSING = object()


# The config's sections whose every key a run of config/paper.yaml uses: each key under them is a row's (stated or
# read) or a not_settings entry's (what it is instead, and why it is no setting of the paper's study).
RUN_SECTIONS = ("studies", "evaluation", "divergence", "toy", "data")


def load(path: Path = MAPPING) -> dict:
    mapping = yaml.safe_load(Path(path).read_text())
    for section, fields in (("not_settings", ("key", "why")), ("claims_not_encoded", ("paper", "where", "why")),
                            ("claims_removed", ("claim", "why"))):  # fmt: skip
        for index, entry in enumerate(mapping.get(section, [])):
            if not all(entry.get(field) for field in fields):
                raise ValueError(f"{path}: {section}[{index}] needs {', '.join(fields)}")
    for index, row in enumerate(mapping["settings"]):
        if row.get("kind") not in KINDS:
            raise ValueError(f"{path}: settings[{index}].kind must be one of {sorted(KINDS)}, not {row.get('kind')!r}")
        if row["kind"] != "pending" and "key" in row and "value" not in row:
            raise ValueError(f"{path}: settings[{index}] names a key but no value")
        if row["kind"] in ("read", "open", "pending") and not row.get("reading"):
            raise ValueError(f"{path}: settings[{index}] ({row['kind']}) says no reading")
    return mapping


def expand(path: str) -> list[str]:
    """A path with one ``{a,b,c}`` part (the same setting in several studies) as its paths; others as themselves."""
    found = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", path)
    if not found:
        return [path]
    head, names, tail = found.groups()
    return [path for name in names.split(",") for path in expand(f"{head}{name.strip()}{tail}")]


def keys_and_values(row: dict) -> list[tuple[str, object]]:
    """(config path, value) pairs of a row: ``key`` a path and ``value`` its value, or both lists of the same length;
    a path with ``{a,b}`` holds its value at each of its paths."""
    if "key" not in row:
        return []
    if isinstance(row["key"], str):
        return [(path, row.get("value", MISSING)) for path in expand(row["key"])]
    values = row.get("value", [MISSING] * len(row["key"]))
    if len(values) != len(row["key"]):
        raise ValueError(f"paper-settings row {row['paper'][:40]!r}: {len(row['key'])} keys but {len(values)} values")
    return [(path, value) for key, value in zip(row["key"], values, strict=True) for path in expand(key)]


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
    rows = [row for row in mapping["settings"] if row["kind"] != "pending"]
    named = [path for row in rows for path, _ in keys_and_values(row)]
    named += [path for entry in mapping.get("not_settings", []) for path in expand(entry["key"])]
    paths = [path for section in RUN_SECTIONS for path in leaf_paths(config.get(section, {}), section)]
    return [path for path in paths if not any(_covers(pattern, path) for pattern in named)]


def lookup(config: dict, path: str):
    """The value at a dotted path of a validated config, or MISSING."""
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def mismatches(config: dict, mapping: dict) -> list[str]:
    """Each checked row's key whose config value is not the row's (a pending row's keys must only exist)."""
    found = []
    for row in mapping["settings"]:
        for path, value in keys_and_values(row):
            held = lookup(config, path)
            if held is MISSING:
                found.append(f"{path}: not in the config")
            elif row["kind"] != "pending" and held != value:
                found.append(f"{path}: the config has {held!r}, the paper's setting is {value!r} ({row['where']})")
    return found


def references(where: str) -> list[str]:
    """The sections, figures and tables a ``where`` (or a claim's ``paper:``) names, each as written."""
    parts = re.split(r",\s*", re.sub(r"\s*\([^)]*\)", "", where))  # remarks in brackets are no references
    return [part.removeprefix("App. ").strip() for part in parts if part.strip()]


def unknown_references(where: str, paper: dict) -> list[str]:
    """The references of ``where`` that the paper does not have (``paper``: its sections, figures and tables)."""
    unknown, previous = [], ""
    for reference in references(where):
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
        if not known:
            unknown.append(reference)
        previous = reference
    return unknown


def _format(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(_format, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_format(item)}" for key, item in value.items()) + "}"
    if isinstance(value, bool):
        return str(value).lower()  # as YAML writes it
    if value is None:
        return "null"
    if isinstance(value, float):
        return re.sub(r"e([+-])0(\d)", r"e\1\2", f"{value:g}")  # 1e-06 -> 1e-6
    return str(value)


def grouped(row: dict, studies: list[str]) -> list[tuple[str, object]]:
    """A row's (key, value) pairs as the page shows them: one key per setting and value, with the studies that hold it
    gathered (``studies.{a,b}.x``, or ``studies.*.x`` for every study), in the row's order."""
    groups: dict[tuple[str, str], list[str]] = {}
    values: dict[tuple[str, str], object] = {}
    for path, value in keys_and_values(row):
        parts = path.split(".", 2)
        study, rest = (parts[1], parts[2]) if parts[0] == "studies" and len(parts) == 3 else (None, path)
        group = (rest, repr(value))
        groups.setdefault(group, []).append(study)
        values[group] = value
    shown = []
    for (rest, _), names in groups.items():
        if names == [None]:
            shown.append((rest, values[(rest, _)]))
            continue
        if sorted(names) == sorted(studies):
            which = "*"
        else:
            which = names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
        shown.append((f"studies.{which}.{rest}", values[(rest, _)]))
    return shown


def _row(row: dict, studies: list[str]) -> str:
    keys = "<br>".join(f"`{key}`" + ("" if value is MISSING else f" = `{_format(value)}`")
                       for key, value in grouped(row, studies))  # fmt: skip
    if row["kind"] == "stated":  # the paper's words, quoted, are the mapping's: the page says where and what
        return f"| {row['where']} | {keys} |"
    if row["kind"] == "open":  # the paper does not say: where it is silent, and the choice
        return f"| {row['where']} | {keys} | {' '.join(row['reading'].split())} |"
    cells = [row["where"], " ".join(str(row["paper"]).split()), keys, " ".join(row["reading"].split())]
    return "| " + " | ".join(cells) + " |"


def _studies(mapping: dict) -> list[str]:
    """Every study the rows name (config/paper.yaml's): ``studies.*`` on the page stands for all of them."""
    paths = [path for row in mapping["settings"] for path, _ in keys_and_values(row)]
    return sorted({path.split(".")[1] for path in paths if path.startswith("studies.")})


def page(mapping: dict) -> str:
    """docs/paper-settings.md."""
    pending = sum(row["kind"] == "pending" for row in mapping["settings"])
    studies = _studies(mapping)
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
        (
            f"**{pending} known difference{'s are' if pending != 1 else ' is'} not yet resolved**: the last table. "
            "Every other row is what `config/paper.yaml` runs."
            if pending
            else "Every row is what `config/paper.yaml` runs; where its runs still differ: "
            "[differences](differences.md)."
        ),
        "",
    ]
    for kind, heading in KINDS.items():
        rows = [row for row in mapping["settings"] if row["kind"] == kind]
        if not rows:
            continue
        columns = {"stated": ["where", "config"], "open": ["where", "config", "the choice, and why"]}.get(
            kind, ["where", "the paper", "config", "reading"])
        lines += [f"## {heading[0].upper()}{heading[1:]}", "", "| " + " | ".join(columns) + " |",
                  "|" + "---|" * len(columns), *(_row(row, studies) for row in rows), ""]  # fmt: skip
    return "\n".join(lines + _other_sections(mapping))


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(" ".join(str(cell).split()) for cell in row) + " |" for row in rows), ""]  # fmt: skip


def _other_sections(mapping: dict) -> list[str]:
    """The paper's claims the claims table cannot express. The keys that are no setting of the paper's, and the claims
    removed from config/paper.yaml, stay in config/paper-settings.yaml with their reasons."""
    lines = [
        "## The paper's claims no claim expresses",
        "",
        "The paper's claims [the claims table](claims.md) cannot judge, and why (every other key a run reads, and why "
        "it is no setting of the paper's: `not_settings` in `config/paper-settings.yaml`):",
        "",
        *_table(
            ["where", "the paper", "why"],
            [[e["where"], e["paper"], e["why"]] for e in mapping.get("claims_not_encoded", [])],
        ),
    ]
    return lines[:-1]  # the page ends with its last row
