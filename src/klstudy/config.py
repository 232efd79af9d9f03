"""Config validation: every key checked before any job starts, every error naming the key.

The schema is the workflow's own (``workflow/schemas/config.schema.yaml``, a Snakemake-style JSON
schema). Snakemake's ``snakemake.utils.validate`` reads the same kind of file, but its error dumps the
violated sub-schema and names the key only as ``instance['toy']['estimators'][1]``; researchers editing
a YAML file want ``toy.estimators[1]``. So we run the same jsonschema validator (with defaults filled
in, as Snakemake does) and rewrite the first error into one line.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config value is missing, unknown or invalid; the message names the key."""


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    with open(path) as handle:
        return yaml.safe_load(handle)


def _with_defaults(validator_class):
    """Validator that fills in schema defaults while it checks (jsonschema FAQ recipe)."""
    check_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, subschema in properties.items():
                if isinstance(subschema, dict) and "default" in subschema:
                    instance.setdefault(key, subschema["default"])
        yield from check_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def key_path(parts) -> str:
    """('toy', 'estimators', 1) -> 'toy.estimators[1]'."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    where = key_path(error.absolute_path)
    if error.validator == "required":
        missing = error.message.split("'")[1]
        return f"config key '{key_path([*error.absolute_path, missing])}' is missing"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        name = key_path([*error.absolute_path, unknown[0]]) if unknown else where
        hint = f" (allowed here: {', '.join(allowed)})" if allowed else ""
        return f"config key '{name}' is not a known setting{hint}"
    if error.validator == "propertyNames":
        return f"config key '{where}' has an invalid name {error.instance!r}: use letters, digits, '.', '_', '-'"
    return f"config key '{where}': {error.message}"


def validate_config(config: dict, schema: dict | None = None) -> dict:
    """Check ``config`` against the schema and cross-references; fill defaults; return it.

    Raises ConfigError naming the offending key.
    """
    schema = schema or load_schema()
    validator = _with_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), list(map(str, e.path))))
    if errors:
        # The shallowest error is the one the user wrote; deeper ones often follow from it.
        raise ConfigError(_describe(jsonschema.exceptions.best_match(errors)))
    _check_references(config)
    return config


def _check_name(config: dict, section: str, name: str, where: str) -> None:
    if name not in config[section]:
        raise ConfigError(
            f"config key '{where}': {name!r} is not defined under '{section}' "
            f"(defined: {', '.join(sorted(config[section]))})"
        )


def _check_references(config: dict) -> None:
    """What a schema cannot say: names used in one section are defined in another."""
    for alias, model in config["models"].items():
        for dataset in model.get("warm_start_data", {}):
            _check_name(config, "data", dataset, f"models.{alias}.warm_start_data.{dataset}")
    for i, study in enumerate(config["evaluation"]["studies"]):
        _check_name(config, "studies", study, f"evaluation.studies[{i}]")
    for i, task in enumerate(config["evaluation"]["tasks"]):
        _check_name(config, "data", task, f"evaluation.tasks[{i}]")
    for study, spec in config["studies"].items():
        for i, model in enumerate(spec["models"]):
            _check_name(config, "models", model, f"studies.{study}.models[{i}]")
        for key in ("train_data", "heldout_data"):
            _check_name(config, "data", spec[key], f"studies.{study}.{key}")
        train = spec["train"]
        if train["batch_prompts"] % train["minibatch_prompts"]:
            raise ConfigError(
                f"config key 'studies.{study}.train.minibatch_prompts': {train['minibatch_prompts']} does not divide "
                f"batch_prompts {train['batch_prompts']} (their ratio is the number of updates per batch)"
            )
