"""The configuration reference (config/README.md), written from the schema so that the two cannot disagree.

`python -m klstudy config-reference --out config/README.md` writes it; tests/test_docs.py fails when the committed
file is not what the schema gives. Every key of workflow/schemas/config.schema.yaml becomes one row: its path (a
mapping's free names as ``<name>``, a list's items as ``[]``), its type, its default and its description. Keys that
exist only for some values of another key (a dataset's ``kind``, a model's ``source``) get a table of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from klstudy import config as configuration

# What a mapping's free keys stand for, by the mapping's own key (the placeholder in a row's path).
PLACEHOLDERS = {"data": "<dataset>", "models": "<model>", "studies": "<study>", "figures": "<figure>",
                "claims": "<claim>", "settings": "<setting>", "warm_start_data": "<dataset>"}  # fmt: skip
# How a row names a type defined once under $defs.
DEFINED_TYPES = {"alias": "name", "kl_config": "KL configuration (`none`, `k1-reward`, `k3-loss-ratio`, …)",
                 "beta": "number ≥ 0"}  # fmt: skip
BOUNDS = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}
LONG_DEFAULT_WORDS = 15  # a default longer than this is written under its table, in YAML's block style

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
checked before any job starts; a mistake stops the run with one line naming the key. `<dataset>`, `<model>`,
`<study>` … stand for names you choose; `[]` marks the items of a list. *required* means the key has no default and
must be given.
"""


@dataclass
class Table:
    """One table of the reference: a heading, what it is about, and one (path, type, default, meaning) row a key."""

    title: str
    about: str = ""
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


def reference(schema: dict | None = None) -> str:
    """The whole reference as Markdown."""
    return "\n".join([INTRO, *(_render(table) for table in tables(schema))])


def tables(schema: dict | None = None) -> list[Table]:
    """One table per top-level key (a section's own row is its table's opening line), then one per allOf branch."""
    schema = schema or configuration.load_schema()
    found = []
    for key, sub in schema["properties"].items():
        section = [Table(f"`{key}`")]
        _walk(sub, key, key in schema.get("required", []), schema.get("$defs", {}), section, section[0])
        (own, *rows), opening = section[0].rows, section[0]
        if rows or len(section) > 1:
            opening.rows = rows
            opening.about = f"{own[3]} ({own[1]}; {'default ' if own[2].startswith('`') else ''}{own[2]})"
        found += section
    return found


def _resolve(sub: dict, definitions: dict) -> dict:
    """``sub`` with its $ref's definition merged under it (its own keys win)."""
    if "$ref" not in sub:
        return sub
    return {**definitions[sub["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in sub.items() if k != "$ref"}}


def _walk(sub: dict, path: str, required: bool, definitions: dict, tables: list[Table], table: Table) -> None:
    """Add the row of the key at ``path`` to ``table``, then the rows of what it holds: a list's items' keys, its own
    keys, its free names' keys, and a table for each branch (allOf: if a key has these values, then these keys)."""
    resolved = _resolve(sub, definitions)
    default = f"`{flow(resolved['default'])}`" if "default" in resolved else "*required*" if required else "unset"
    table.rows.append((path, _type(sub, definitions), default, " ".join(str(resolved.get("description", "")).split())))
    items, values = resolved.get("items"), resolved.get("additionalProperties")
    if resolved.get("type") == "array" and isinstance(items, dict):
        _properties(_resolve(items, definitions), f"{path}[]", definitions, tables, table)
        return
    _properties(resolved, path, definitions, tables, table)
    values = _resolve(values, definitions) if isinstance(values, dict) else {}
    if "properties" in values or "allOf" in values:
        path = f"{path}.{PLACEHOLDERS.get(path.rsplit('.', 1)[-1], '<name>')}"
        _properties(values, path, definitions, tables, table)
        for branch in values.get("allOf", []):
            ((selector, condition),) = branch["if"]["properties"].items()
            shown = ", ".join(f"`{v}`" for v in condition.get("enum", [condition.get("const")]))
            tables.append(Table(f"`{path}` with `{selector}`: {shown}"))
            _properties(branch["then"], path, definitions, tables, tables[-1])


def _properties(sub: dict, path: str, definitions: dict, tables: list[Table], table: Table) -> None:
    for key, child in sub.get("properties", {}).items():
        if child is not True:  # True: a branch re-admits a key declared above it
            _walk(child, f"{path}.{key}", key in sub.get("required", []), definitions, tables, table)


def _type(sub: dict, definitions: dict) -> str:
    """A short name of the values ``sub`` admits: 'integer ≥ 1', 'list of name', 'one of `hf`, `vllm`'."""
    if "$ref" in sub and sub["$ref"].rsplit("/", 1)[-1] in DEFINED_TYPES:
        return DEFINED_TYPES[sub["$ref"].rsplit("/", 1)[-1]]
    sub, kind = _resolve(sub, definitions), _resolve(sub, definitions).get("type")
    alternatives = sub.get("anyOf", sub.get("oneOf"))
    values = sub.get("additionalProperties")
    if alternatives:
        return " or ".join(_type(alternative, definitions) for alternative in alternatives)
    if "enum" in sub or "const" in sub:
        return "one of " * ("enum" in sub) + ", ".join(f"`{flow(v)}`" for v in sub.get("enum", [sub.get("const")]))
    if kind == "array":
        return f"list of {_type(sub.get('items', {}), definitions)}"
    if kind == "object" and isinstance(values, dict) and "properties" not in sub:
        return f"mapping of names to {_type(values, definitions)}"
    limits = [f"{sign} {flow(sub[word])}" for word, sign in BOUNDS.items() if word in sub]
    bounds = " " + ", ".join(limits) if limits else ""
    kinds = kind if isinstance(kind, list) else [kind or "any"]
    return " or ".join(k + bounds if k in ("integer", "number") else k for k in kinds)


def flow(value) -> str:
    """A value as it would be written in the YAML config (YAML's flow style, quoted where YAML needs it)."""
    dumped = yaml.safe_dump(value, default_flow_style=True, width=float("inf"), allow_unicode=True, sort_keys=False)
    return dumped.removesuffix("\n...\n").strip()


def _render(table: Table) -> str:
    lines, below = [f"## {table.title}", "", *([table.about, ""] if table.about else [])], []
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, kind, default, meaning in table.rows:
        if len(default.split()) > LONG_DEFAULT_WORDS:
            below += ["", f"The default of `{path}`:", "", "```yaml", _block(default.strip("`")), "```"]
            default = "below the table"
        cells = (f"`{path}`", kind, default, meaning)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") or " " for cell in cells) + " |")
    return "\n".join(lines + below) + "\n"


def _block(flow: str) -> str:
    """A default in YAML's block style (one key a line)."""
    return yaml.safe_dump(yaml.safe_load(flow), sort_keys=False, allow_unicode=True, width=116).rstrip()
