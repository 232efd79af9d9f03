"""The configuration reference (config/README.md), written from the schema so that the two cannot disagree.

`python -m klstudy config-reference --out config/README.md` writes it; tests/test_docs.py fails when the committed
file is not what the schema gives. Every key of workflow/schemas/config.schema.yaml becomes one row: its path (a
mapping's free names as ``<name>``, a list's items as ``[]``), its type, its default and its description. Keys that
exist only for some values of another key (a dataset's ``kind``, a model's ``source``) get a table of their own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import yaml

from klstudy import config as configuration

# What a mapping's free keys stand for, by the mapping's own key (the placeholder in a row's path).
PLACEHOLDERS = {
    "data": "<dataset>",
    "models": "<model>",
    "studies": "<study>",
    "figures": "<figure>",
    "claims": "<claim>",
    "settings": "<setting>",
    "warm_start_data": "<dataset>",
}
# How a row names a type defined once under $defs.
DEFINED_TYPES = {
    "alias": "name",
    "kl_config": "KL configuration (`none`, `k1-reward`, `k3-loss-ratio`, …)",
    "beta": "number ≥ 0",
}

INTRO = """\
# Configuration reference

Written by `.venv/bin/python -m klstudy config-reference --out config/README.md` from
[`workflow/schemas/config.schema.yaml`](../workflow/schemas/config.schema.yaml), the one place where keys are defined;
`tests/test_docs.py` fails when this file and the schema disagree. Edit the schema, then run the command.

The configurations: [`config.yaml`](../config.yaml) (the embedded study, the default),
[`paper.yaml`](paper.yaml) (the paper's study, for `snakemake --profile slurm`), [`pilot.yaml`](pilot.yaml) (the
first GPU run: the paper's path with a 0.5B model), [`pilot-7b.yaml`](pilot-7b.yaml) (the 7-8B models' pilot,
written from `paper.yaml` by `.venv/bin/python -m klstudy pilot-config`), [`cluster.yaml`](cluster.yaml) (an
overlay: your cluster's names, named after those three on every cluster command), [`smollm2.yaml`](smollm2.yaml) (a
real chat model on a CPU), [`atlas.yaml`](atlas.yaml) (an overlay: the atlas's bigger grid) and
[`separation.yaml`](separation.yaml) (an overlay merged into `config.yaml`:
`make study CONFIG="config.yaml config/separation.yaml" RUN_DIR=runs/separation`, in a directory of its own as its
cells have the default's paths). [`paper-settings.yaml`](paper-settings.yaml) is no run's config: the settings the
paper states, which [the paper's settings](../docs/paper-settings.md) sets against `paper.yaml`. Every key is
checked before any job starts; a mistake
stops the run with one line naming the key. `<dataset>`, `<model>`, `<study>` … stand for names you choose; `[]`
marks the items of a list. *required* means the key has no default and must be given.
"""


@dataclass
class Table:
    """One table of the reference: a heading, what it is about, and one row per key."""

    title: str
    about: str = ""
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


def reference(schema: dict | None = None) -> str:
    """The whole reference as Markdown."""
    return "\n".join([INTRO, *(_render(table) for table in tables(schema))])


def tables(schema: dict | None = None) -> list[Table]:
    """The reference's tables: one per top-level key, then one per branch of a key's allOf."""
    schema = schema or configuration.load_schema()
    definitions = schema.get("$defs", {})
    found = []
    for key, sub in schema["properties"].items():
        row = _row(sub, key, key in schema.get("required", []), definitions)
        opening = Table(f"`{key}`")
        section = [opening]
        _walk_contents(_resolve(sub, definitions)[0], key, definitions, section, opening)
        if opening.rows or len(section) > 1:  # a section: what it is, then its keys
            opening.about = f"{row[3]} ({row[1]}; {'default ' if row[2].startswith('`') else ''}{row[2]})"
        else:  # a single setting: its own row
            opening.rows.append(row)
        found += section
    return found


def _resolve(sub: dict, definitions: dict) -> tuple[dict, str | None]:
    """``sub`` with its $ref's definition merged under it (its own keys win), and the definition's name."""
    if "$ref" not in sub:
        return sub, None
    name = sub["$ref"].rsplit("/", 1)[-1]
    merged = {**definitions[name], **{k: v for k, v in sub.items() if k != "$ref"}}
    return merged, name


def _row(sub: dict, path: str, required: bool, definitions: dict) -> tuple[str, str, str, str]:
    """(path, type, default, meaning) of the key at ``path``."""
    resolved, _ = _resolve(sub, definitions)
    meaning = " ".join(str(resolved.get("description", "")).split())
    return path, _type(sub, definitions), _default(resolved, required), meaning


def _walk(sub: dict, path: str, required: bool, definitions: dict, tables: list[Table], table: Table) -> None:
    """Add a row for ``sub`` at ``path`` to ``table``, then rows for what it contains (new tables for branches)."""
    table.rows.append(_row(sub, path, required, definitions))
    _walk_contents(_resolve(sub, definitions)[0], path, definitions, tables, table)


def _walk_contents(sub: dict, path: str, definitions: dict, tables: list[Table], table: Table) -> None:
    if sub.get("type") == "array" and isinstance(sub.get("items"), dict):
        items, _ = _resolve(sub["items"], definitions)
        if "properties" in items:
            _walk_properties(items, f"{path}[]", definitions, tables, table)
        return
    _walk_properties(sub, path, definitions, tables, table)
    values = sub.get("additionalProperties")
    if isinstance(values, dict):
        values, _ = _resolve(values, definitions)
        if "properties" in values or "allOf" in values:
            name = PLACEHOLDERS.get(path.rsplit(".", 1)[-1], "<name>")
            _walk_properties(values, f"{path}.{name}", definitions, tables, table)
            _walk_branches(values, f"{path}.{name}", definitions, tables)


def _walk_properties(sub: dict, path: str, definitions: dict, tables: list[Table], table: Table) -> None:
    required = set(sub.get("required", []))
    for key, child in sub.get("properties", {}).items():
        if child is True:  # a branch re-admits a key declared above it
            continue
        _walk(child, f"{path}.{key}", key in required, definitions, tables, table)


def _walk_branches(sub: dict, path: str, definitions: dict, tables: list[Table]) -> None:
    """allOf: [{if: {properties: {kind: {enum: [...]}}}, then: {...}}]: one table per branch."""
    for branch in sub.get("allOf", []):
        ((selector, condition),) = branch["if"]["properties"].items()
        values = condition.get("enum", [condition.get("const")])
        table = Table(f"`{path}` with `{selector}`: {', '.join(f'`{v}`' for v in values)}")
        tables.append(table)
        _walk_properties(branch["then"], path, definitions, tables, table)


def _type(sub: dict, definitions: dict) -> str:
    """A short name of the values ``sub`` admits: 'integer ≥ 1', 'list of name', 'one of `hf`, `vllm`'."""
    sub, defined = _resolve(sub, definitions)
    if defined in DEFINED_TYPES:
        return DEFINED_TYPES[defined]
    for word in ("anyOf", "oneOf"):
        if word in sub:
            return " or ".join(_type(alternative, definitions) for alternative in sub[word])
    if "enum" in sub:
        return "one of " + ", ".join(f"`{_flow(v)}`" for v in sub["enum"])
    if "const" in sub:
        return f"`{_flow(sub['const'])}`"
    kind = sub.get("type")
    if kind == "array":
        return f"list of {_type(sub.get('items', {}), definitions)}"
    if kind == "object" and isinstance(sub.get("additionalProperties"), dict) and "properties" not in sub:
        return f"mapping of names to {_type(sub['additionalProperties'], definitions)}"
    if isinstance(kind, list):
        return " or ".join(kind)
    return (kind or "any") + _bounds(sub)


def _bounds(sub: dict) -> str:
    """' ≥ 1', ' > 0, ≤ 1' or '': the limits of a number."""
    signs = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}
    limits = [f"{sign} {_flow(sub[word])}" for word, sign in signs.items() if word in sub]
    return " " + ", ".join(limits) if limits else ""


def _default(sub: dict, required: bool) -> str:
    if "default" in sub:
        return f"`{_flow(sub['default'])}`"
    return "*required*" if required else "unset"


def _flow(value) -> str:
    """A value as it would be written in the YAML config."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value
    return _flow_inner(value)


def _flow_inner(value) -> str:
    """A value inside a flow collection: strings that YAML would split (a comma, a colon, brackets) quoted."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_flow_inner(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow_inner(item) for item in value) + "]"
    if isinstance(value, str) and re.search(r"[,:{}\[\]#]|^\s|\s$|^$", value):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return _flow(value)
    return json.dumps(value, ensure_ascii=False)


# A default longer than this many words is written under its table, not in its cell.
LONG_DEFAULT_WORDS = 15


def _render(table: Table) -> str:
    lines = [f"## {table.title}", ""]
    if table.about:
        lines += [table.about, ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    below = []
    for row in table.rows:
        path, kind, default, meaning = row
        if len(default.split()) > LONG_DEFAULT_WORDS:
            below.append((path, default))
            row = (path, kind, "below the table", meaning)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") or " " for cell in _coded(row)) + " |")
    for path, default in below:
        lines += ["", f"The default of `{path}`:", "", "```yaml", _block(default.strip("`")), "```"]
    return "\n".join(lines) + "\n"


def _block(flow: str) -> str:
    """A value written in YAML's flow style, in block style (one key a line) where it reads back the same."""
    try:
        value = yaml.safe_load(flow)
    except yaml.YAMLError:
        return flow
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=116).rstrip()


def _coded(row: tuple[str, str, str, str]) -> tuple[str, str, str, str]:
    path, kind, default, meaning = row
    return f"`{path}`", kind, default, meaning
