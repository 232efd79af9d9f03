"""The configuration schema is what it says: YAML's flow mappings end a plain scalar at a comma, so an unquoted
description with a comma in it becomes a shorter description and a stray key. Every node of the schema must use only
JSON-schema keywords, and every description must be a string."""

from pathlib import Path

import pytest
import yaml

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"

# The JSON-schema (draft 2020-12) keywords, by what their values are.
NAMED_SCHEMAS = {"properties", "$defs", "patternProperties", "dependentSchemas"}
SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}
ONE_SCHEMA = {
    "items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems", "additionalItems",
}  # fmt: skip
VALUES = {
    "$schema", "$id", "$ref", "$comment", "$anchor", "title", "description", "type", "enum", "const", "default",
    "examples", "deprecated", "readOnly", "writeOnly", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern", "minItems", "maxItems", "uniqueItems",
    "minContains", "maxContains", "minProperties", "maxProperties", "required", "dependentRequired",
}  # fmt: skip
KEYWORDS = NAMED_SCHEMAS | SCHEMA_LISTS | ONE_SCHEMA | VALUES


def problems(node, path="") -> list[str]:
    """What is wrong with the schema ``node`` and everything under it: keys that are no JSON-schema keyword,
    descriptions and titles that are not strings."""
    if isinstance(node, bool):
        return []
    if not isinstance(node, dict):
        return [f"{path or '/'}: a schema must be a mapping, not {node!r}"]
    found = []
    for key, value in node.items():
        where = f"{path}/{key}"
        if key not in KEYWORDS:
            found.append(f"{where}: not a JSON-schema keyword (an unquoted comma in a flow mapping?)")
        elif key in ("description", "title") and not isinstance(value, str):
            found.append(f"{where}: {value!r} is not a string")
        elif key in NAMED_SCHEMAS:
            for name, sub in value.items():
                found += problems(sub, f"{where}/{name}")
        elif key in SCHEMA_LISTS:
            for index, sub in enumerate(value):
                found += problems(sub, f"{where}/{index}")
        elif key in ONE_SCHEMA:
            found += problems(value, where)
    return found


def test_every_key_of_the_schema_is_a_keyword_and_every_description_a_string():
    assert problems(yaml.safe_load(SCHEMA.read_text())) == []


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{description: an lm-eval job (evaluate_cell, evaluate_base), type: object}", "/evaluate_base)"),
        ("{description: longest response, in tokens, type: integer}", "/in tokens"),
        ('{description: "longest response, in tokens", type: integer}', None),
        ("{properties: {a: {description: [x], type: string}}}", "/properties/a/description"),
    ],
)
def test_the_checker_finds_an_unquoted_comma(line, expected):
    found = problems(yaml.safe_load(line))
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(expected), found


def test_the_trainer_and_the_atlas_take_every_advantage_the_schema_names():
    """train.advantage's enum is the trainer's list (kl.ADVANTAGES less 'none': a baseline is always subtracted), and
    a preset's normalisation may be any of those."""
    from klstudy.config import load_schema
    from klstudy.train import trainer

    schema = load_schema()
    assert schema["$defs"]["normalisation"]["enum"] == list(trainer.TRAINER_ADVANTAGES)
    train = schema["properties"]["studies"]["additionalProperties"]["properties"]["train"]["properties"]
    atlas = schema["properties"]["toy"]["properties"]["atlas"]["properties"]
    preset = atlas["presets"]["additionalProperties"]["properties"]
    for where in (train["advantage"], preset["normalisation"], atlas["normalisations"]["items"]):
        assert where["$ref"] == "#/$defs/normalisation"
