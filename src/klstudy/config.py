"""Config validation: every key checked before any job starts, every error naming the key.

The schema is the workflow's own (``workflow/schemas/config.schema.yaml``, a Snakemake-style JSON
schema). Snakemake's ``snakemake.utils.validate`` reads the same kind of file, but its error dumps the
violated sub-schema and names the key only as ``instance['toy']['estimators'][1]``; researchers editing
a YAML file want ``toy.estimators[1]``. So we run the same jsonschema validator (with defaults filled
in, as Snakemake does) and rewrite the first error into one line.
"""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import yaml

from klstudy import kl
from klstudy.figure_plan import claim_seeds, claims_figures, testable_by_design, training_figures
from klstudy.frameworks import PRESETS

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config value is missing, unknown or invalid; the message names the key."""


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    """The schema, with the KL grammar of klstudy.kl filled in (estimators, placements, configuration names,
    normalisations) and the framework presets' names (every one by default)."""
    with open(path) as handle:
        schema = yaml.safe_load(handle)
    definitions = schema["$defs"]
    definitions["estimator"]["enum"] = list(kl.ESTIMATORS)
    definitions["placement"]["enum"] = list(kl.PLACEMENTS)
    definitions["loss_gradient"]["enum"] = list(kl.LOSS_GRADIENTS)
    definitions["kl_config"]["pattern"] = f"^({kl.NAME_PATTERN})$"
    definitions["normalisation"]["enum"] = [name for name in kl.ADVANTAGES if name != "none"]  # a baseline always
    definitions["preset"]["enum"] = list(PRESETS)
    atlas = schema["properties"]["toy"]["properties"]["atlas"]["properties"]
    atlas["presets"]["default"] = list(PRESETS)
    return schema


def _with_defaults(validator_class):
    """Validator that fills in schema defaults while it checks (jsonschema FAQ recipe)."""
    check_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, subschema in properties.items():
                if isinstance(subschema, dict) and "default" in subschema:
                    instance.setdefault(key, copy.deepcopy(subschema["default"]))  # never the schema's own object
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
    _resolve_paths(config)
    return config


def _resolve_paths(config: dict) -> None:
    """A local copy's path (``local_dir``, a GGUF file without ``package``) relative to the repository root, as a
    pinned model's is: a job runs in the run's directory (``make study RUN_DIR=…``), which need not be the root."""
    for section in ("data", "models"):
        for entry in config.get(section, {}).values():
            for key in ("local_dir", "gguf"):
                if entry.get(key) and not (key == "gguf" and entry.get("package")):
                    entry[key] = str(REPO_ROOT / entry[key])  # an absolute path stays as it is


def section_settings(section: str, entry: dict, name: str | None = None, schema: dict | None = None) -> dict:
    """One section of the config (or its entry ``name``, for sections of named entries such as ``data``) checked, its
    defaults filled: what a stage's ``--settings`` carries, as the workflow hands it. A stage run by hand with a part
    of a section gets the schema's defaults too, or an error naming the key that has none."""
    schema = schema or load_schema()
    only = {"$defs": schema["$defs"], "type": "object", "properties": {section: schema["properties"][section]}}
    config = {section: {name: entry} if name is not None else entry}
    errors = list(_with_defaults(jsonschema.Draft202012Validator)(only).iter_errors(config))
    if errors:
        raise ConfigError(_describe(jsonschema.exceptions.best_match(errors)))
    return config[section][name] if name is not None else config[section]


def dataset_settings(name: str, entry: dict, schema: dict | None = None) -> dict:
    """One ``data`` entry checked, its defaults filled: what the prepare_data rule hands to its job."""
    return section_settings("data", entry, name, schema)


def _check_name(config: dict, section: str, name: str, where: str) -> None:
    if name not in config[section]:
        raise ConfigError(
            f"config key '{where}': {name!r} is not defined under '{section}' "
            f"(defined: {', '.join(sorted(config[section]))})"
        )


def pinned_directory(pinned: dict) -> Path:
    """Where a pinned model's files are: ``pinned.path``, relative to the repository root unless absolute."""
    return REPO_ROOT / pinned["path"]  # an absolute path replaces the root


def _check_references(config: dict) -> None:
    """What a schema cannot say: names used in one section are defined in another."""
    for alias, model in config["models"].items():
        for dataset in model.get("warm_start_data", {}):
            _check_name(config, "data", dataset, f"models.{alias}.warm_start_data.{dataset}")
        pinned = model.get("pinned")
        if pinned is not None and not (pinned_directory(pinned) / "klstudy_build.json").is_file():
            raise ConfigError(
                f"config key 'models.{alias}.pinned.path': {pinned['path']} holds no built model (no "
                f"klstudy_build.json; paths are relative to the repository root); build one with `python -m klstudy "
                f"pin-base-model --model {alias}`, or remove 'pinned' to build the model on this machine"
            )
    for study, kl_configs in config["evaluation"]["studies"].items():
        _check_name(config, "studies", study, f"evaluation.studies.{study}")
        for i, kl_config in enumerate(kl_configs):
            if kl_config not in config["studies"][study]["kl"]:
                raise ConfigError(
                    f"config key 'evaluation.studies.{study}[{i}]': {kl_config!r} is not trained by study {study!r} "
                    f"(its kl: {', '.join(config['studies'][study]['kl'])})"
                )
    for study in config["evaluation"]["study_max_tokens"]:
        if study not in config["evaluation"]["studies"]:
            raise ConfigError(
                f"config key 'evaluation.study_max_tokens.{study}': study {study!r} is not evaluated "
                f"(evaluation.studies: {', '.join(config['evaluation']['studies']) or 'none'})"
            )
    for i, task in enumerate(config["evaluation"]["tasks"]):
        _check_name(config, "data", task, f"evaluation.tasks[{i}]")
    for study, spec in config["studies"].items():
        for i, model in enumerate(spec["models"]):
            _check_name(config, "models", model, f"studies.{study}.models[{i}]")
        for key in ("train_data", "heldout_data"):
            _check_name(config, "data", spec[key], f"studies.{study}.{key}")
        train = spec["train"]
        accelerate_config = train.get("accelerate_config")
        if accelerate_config is not None and not (REPO_ROOT / accelerate_config).is_file():
            raise ConfigError(
                f"config key 'studies.{study}.train.accelerate_config': no file {accelerate_config} "
                f"(paths are relative to the repository root, e.g. config/accelerate/fsdp.yaml)"
            )
        launch = _launch_config(accelerate_config)
        if train.get("lora") and launch.get("distributed_type") == "FSDP":
            # save_policy merges the adapters of a whole model; under FSDP each process holds a shard of it.
            raise ConfigError(
                f"config key 'studies.{study}.train.lora': LoRA is not supported with {accelerate_config} (FSDP); "
                "train all weights, or launch without FSDP"
            )
        if train["gradient_checkpointing"] and (launch.get("fsdp_config") or {}).get("fsdp_activation_checkpointing"):
            # transformers' Trainer refuses both at start-up, on the cluster, after the queue: say it now.
            raise ConfigError(
                f"config key 'studies.{study}.train.gradient_checkpointing': must be false with "
                f"{accelerate_config}, whose fsdp_activation_checkpointing already recomputes activations"
            )
        window = spec["health"]["collapse_window"]
        if 2 * window > train["steps"]:
            # HealthRules.verdict needs two windows of rewards: such a rule could never call a run collapsed.
            raise ConfigError(
                f"config key 'studies.{study}.health.collapse_window': {window} needs {2 * window} steps to decide a "
                f"collapse, and the study has {train['steps']}: at most {train['steps'] // 2} (0 turns the rule off)"
            )
        if "gpus" in spec and not config["resources"]["train"]["gpus"]:
            raise ConfigError(
                f"config key 'studies.{study}.gpus': training jobs ask for no GPU (resources.train.gpus is 0), so no "
                "study can ask for a number of its own"
            )
        if train["heldout_decoding"] == "greedy" and train["heldout_samples"] > 1:
            raise ConfigError(
                f"config key 'studies.{study}.train.heldout_samples': {train['heldout_samples']} greedy responses "
                "per prompt would all be the same: 1 with heldout_decoding greedy"
            )
        if train["batch_prompts"] % train["minibatch_prompts"]:
            raise ConfigError(
                f"config key 'studies.{study}.train.minibatch_prompts': {train['minibatch_prompts']} does not divide "
                f"batch_prompts {train['batch_prompts']} (their ratio is the number of updates per batch)"
            )
        processes = training_processes(config, study)
        try:
            batch_layout(train, processes)
        except ValueError as error:  # every training job would fail at start-up, on the cluster, after the queue
            where = f"with {processes} processes ({accelerate_config})" if accelerate_config else "in one process"
            raise ConfigError(f"config key 'studies.{study}.train': {where}, {error}") from None
    _check_divergence(config)
    _check_gpu_model(config.get("cluster", {}))
    for name, claim in config["claims"].items():
        check_claim(config, claim, f"claims.{name}")
    for name, figure in config["figures"].items():
        for i, panel in enumerate(figure["panels"]):
            _check_panel(config, panel, f"figures.{name}.panels[{i}]")


def gres_refusal(gres: str) -> str | None:
    """Why the SLURM plugin would refuse ``gres`` at submission (its own check, ``set_gres_string``), or None when it
    takes it, or when the plugin is not installed here (a run without SLURM)."""
    try:
        from snakemake_executor_plugin_slurm.utils import set_gres_string
        from snakemake_interface_common.exceptions import WorkflowError
    except ImportError:
        return None

    class Resources(dict):
        __getattr__ = dict.__getitem__

    try:
        set_gres_string(type("Job", (), {"resources": Resources(gres=gres)})())
    except WorkflowError as error:
        return str(error).strip()
    return None


def _check_gpu_model(cluster: dict) -> None:
    """A GPU name that --gres cannot carry (the plugin refuses hyphens, as in nvml's nvidia_a100-sxm4-80gb) fails
    here, not at the first GPU job's submission, after the queue of CPU jobs."""
    model = cluster.get("gpu_model")
    if model and cluster.get("gpu_request", "gres") == "gres" and gres_refusal(f"gpu:{model}:1"):
        raise ConfigError(
            f"config key 'cluster.gpu_model': {model!r} cannot be sent as --gres=gpu:{model}:N (the SLURM plugin "
            "takes letters, digits, '_' and '.' in a GPU name); set cluster.gpu_request: gpus-per-node, which asks "
            f"--gpus-per-node={model}:N"
        )


def batch_layout(train: dict, processes: int) -> tuple[int, int]:
    """(completions per micro-batch per process, gradient-accumulation steps) for one optimiser step.

    One optimiser step sees minibatch_prompts × rollouts completions in total, split over the processes
    (GPUs) that `accelerate launch` started, then into micro-batches of at most ``micro_batch``.
    """
    minibatch = train["minibatch_prompts"] * train["rollouts"]
    if minibatch % processes:
        raise ValueError(f"a minibatch of {minibatch} completions cannot be split over {processes} processes")
    per_process = minibatch // processes
    micro = min(train.get("micro_batch") or per_process, per_process)  # unset: the whole share at once
    if train["batch_prompts"] % train["minibatch_prompts"] or per_process % micro:
        raise ValueError(
            "batch_prompts must be a multiple of minibatch_prompts, and each process's share of the minibatch "
            f"({per_process} completions) a multiple of micro_batch ({micro})"
        )
    return micro, per_process // micro


def training_processes(config: dict, study: str) -> int:
    """Processes that train each cell of ``study``: one without an accelerate config; with one, a process per GPU the
    job asks SLURM for (resources.train: gpus × nodes; the rule passes it as --num_processes, which accelerate reads as
    the total over all nodes), or the launch config's own num_processes for jobs that ask for no GPU (CPU tests)."""
    accelerate_config = config["studies"][study]["train"].get("accelerate_config")
    if accelerate_config is None:
        return 1
    resources = config["resources"]["train"]
    return train_gpus(config, study) * resources["nodes"] or _launch_config(accelerate_config).get("num_processes", 1)


def train_gpus(config: dict, study: str) -> int:
    """GPUs per node that train each cell of ``study``: the study's own `gpus`, else resources.train.gpus."""
    return config["studies"][study].get("gpus", config["resources"]["train"]["gpus"])


def _launch_config(accelerate_config: str | None) -> dict:
    """A study's accelerate launch config (empty when it runs in one process without one)."""
    return yaml.safe_load((REPO_ROOT / accelerate_config).read_text()) or {} if accelerate_config else {}


def _check_subset(values, allowed, where: str, what: str) -> None:
    for i, value in enumerate(values):
        if value not in allowed:
            raise ConfigError(
                f"config key '{where}[{i}]': {value!r} is not among the {what} ({', '.join(map(str, allowed))})"
            )


def _check_cells_selection(config: dict, selection: dict, where: str) -> None:
    """A selection of a study's cells (study, models/model, kl, betas, seeds) names only what the study trains."""
    _check_name(config, "studies", selection["study"], f"{where}.study")
    spec = config["studies"][selection["study"]]
    if "model" in selection:
        _check_subset([selection["model"]], spec["models"], f"{where}.model", f"models of study {selection['study']}")
    _check_subset(selection.get("models", []), spec["models"], f"{where}.models", "study's models")
    _check_subset(selection.get("kl", []), spec["kl"], f"{where}.kl", "study's kl configurations")
    _check_subset(selection.get("betas", []), spec["betas"], f"{where}.betas", "study's betas")
    _check_subset(selection.get("seeds", []), spec["seeds"], f"{where}.seeds", "study's seeds")


def _check_divergence(config: dict) -> None:
    section = config["divergence"]
    _check_cells_selection(config, section, "divergence")
    for i, task in enumerate(section["tasks"]):
        _check_name(config, "data", task, f"divergence.tasks[{i}]")
    last = config["studies"][section["study"]]["train"]["steps"]
    _check_subset(section["steps"], range(last + 1), "divergence.steps", f"steps 0..{last} of the study")


TREND_MIN_BETAS = 3  # a trend over β needs at least three values (two make it one step: baseline_beta below)


def selected_betas(selector, betas: list[float]) -> list[float]:
    """The β a claim's `beta` names among a study's: each (sorted), max, min, a value, a list of values (sorted), or
    trend (every β: one row, the slope over them)."""
    if selector in ("each", "trend"):
        return sorted(betas)
    if selector in ("max", "min"):
        return [max(betas) if selector == "max" else min(betas)]
    return sorted(map(float, selector)) if isinstance(selector, list) else [float(selector)]


def claim_models(config: dict, claim: dict) -> list[str]:
    """The models a claim is judged on: its `model`, or each of its study's."""
    return [claim["model"]] if "model" in claim else config["studies"][claim["study"]]["models"]


def baseline_beta_of(selector, beta: float, betas: list[float]) -> float | None:
    """The baseline's β for a candidate at ``beta``: the same, max, min, a value, or "below": the next smaller β of
    the baseline's study (None at its smallest), so that `beta: each` with it tests each step of the β grid."""
    if selector == "same":
        return beta
    if selector == "below":
        smaller = [b for b in betas if b < beta]
        return max(smaller) if smaller else None
    return selected_betas(selector, betas)[0]


def check_claim(config: dict, claim: dict, where: str) -> None:
    """A claim names cells the grid trains, and a measurement that exists for both of its sides (public: tests keep
    the claims a reduced grid can still test)."""
    metric, baseline = claim["metric"], claim["baseline"]
    baseline_study = claim.get("baseline_study", claim["study"])
    _check_cells_selection(config, {"study": claim["study"], "kl": [claim["candidate"]]}, where)
    selection = {"study": baseline_study} if baseline == "base" else {"study": baseline_study, "kl": [baseline]}
    _check_cells_selection(config, selection, f"{where}.baseline")
    for key, study in (("beta", claim["study"]), ("baseline_beta", baseline_study)):
        if not isinstance(claim[key], str):
            values = claim[key] if isinstance(claim[key], list) else [claim[key]]
            _check_subset(values, config["studies"][study]["betas"], f"{where}.{key}", f"betas of {study}")
    models = config["studies"][claim["study"]]["models"]
    _check_subset([claim["model"]] if "model" in claim else [], models, f"{where}.model", f"models of {claim['study']}")
    if "model" in claim and claim["model"] not in config["studies"][baseline_study]["models"]:
        raise ConfigError(f"config key '{where}.model': {claim['model']!r} is not a model of {baseline_study!r}")

    def refuse(key: str, why: str):
        raise ConfigError(f"config key '{where}.{key}': {why}")

    study_betas, baseline_betas = (config["studies"][name]["betas"] for name in (claim["study"], baseline_study))
    candidate_betas = [0.0] if claim["candidate"] == "none" else selected_betas(claim["beta"], study_betas)
    if claim["beta"] == "trend" and (
        len(study_betas) < TREND_MIN_BETAS
        or claim["candidate"] == "none"  # no KL is one run at β = 0: nothing to slope over
        or baseline != claim["candidate"]
        or baseline_study != claim["study"]
        or claim["baseline_beta"] != "same"
    ):
        refuse("beta", f"trend: the slope of the candidate's metric over log10 β needs {TREND_MIN_BETAS} or more β "
               f"in {claim['study']} (it has {len(study_betas)}), a KL configuration (not none) and the candidate as "
               "its own baseline (same study, baseline_beta same)")  # fmt: skip
    if all(baseline_beta_of(claim["baseline_beta"], beta, baseline_betas) is None for beta in candidate_betas):
        refuse("baseline_beta", f"below: no β of the candidate has a smaller β in {baseline_study} to compare with")
    if baseline == "base" and (metric == "final_kl" or baseline_study != claim["study"]):
        refuse("baseline", "base is the base model measured as the candidate's own runs measure it: not with "
               "final_kl (its KL to itself is 0), nor with another baseline_study")  # fmt: skip
    if claim["predicted"] == "same" and "margin" not in claim:
        refuse("margin", "predicted 'same' needs a margin (the largest |effect| that counts as the same)")
    if claim["predicted"] == "table1" and (metric != "final_kl" or baseline != "none"):
        refuse("predicted", "table1 predicts the KL to the reference against no KL: metric final_kl, baseline none")
    if claim["pair_by"] == "questions" and metric != "heldout":
        refuse("pair_by", "questions pairs held-out pass@1 only (the metric with each question's score)")
    sides = [(claim["study"], claim["candidate"])] + ([] if baseline == "base" else [(baseline_study, baseline)])
    if metric == "evaluation":
        for study, kl_config in sides:
            if kl_config not in config["evaluation"]["studies"].get(study, []):
                refuse("metric", f"evaluation: {kl_config} of study {study} is not under evaluation.studies")
        if claim["domain"] not in ("in-domain", "out-of-domain", "all"):
            _check_subset([claim["domain"]], config["evaluation"]["tasks"], f"{where}.domain", "evaluation.tasks")
    if metric in ("forward_kl", "entropy"):
        section = config["divergence"]
        for study, kl_config in sides:
            if study != section["study"] or kl_config not in section["kl"]:
                refuse("metric", f"{metric}: {kl_config} of study {study} saves no snapshots (see divergence)")
        _check_subset([claim["task"]] if "task" in claim else [], section["tasks"], f"{where}.task", "divergence.tasks")


def unjudgeable_claims(config: dict) -> dict[str, str]:
    """Each claim of a validated config that its design can never judge, with why: it pairs fewer than two training
    seeds (figure_plan.testable_by_design). check_claim has already refused a claim naming a study, configuration, β
    or model the grid lacks."""
    found = {}
    for name, claim in config["claims"].items():
        if not testable_by_design(config, claim):
            seeds = sorted(claim_seeds(config, claim))
            found[name] = f"pairs {len(seeds)} training seed{'s' * (len(seeds) != 1)} ({seeds}); the rule needs 2"
    return found


def _check_panel(config: dict, panel: dict, where: str) -> None:
    _check_cells_selection(config, panel, where)
    if panel["kind"] == "bars":
        evaluated = config["evaluation"]["studies"].get(panel["study"])
        if evaluated is None:
            raise ConfigError(f"config key '{where}.study': study {panel['study']!r} is not under evaluation.studies")
        _check_subset(
            panel.get("kl", evaluated), evaluated, f"{where}.kl", f"evaluated kl configurations of {panel['study']}"
        )
    for i, other in enumerate(panel.get("with", [])):
        _check_name(config, "studies", other, f"{where}.with[{i}]")
        if panel["kind"] != "curves":
            raise ConfigError(f"config key '{where}.with': only curves panels draw other studies beside their own")
        mine, theirs = config["studies"][panel["study"]], config["studies"][other]
        _check_subset([panel["model"]], theirs["models"], f"{where}.with[{i}]", f"models of study {other}")
        design = ("heldout_data",), ("batch_prompts", "minibatch_prompts", "rollouts", "steps", "async_level")
        differ = [k for k in design[0] if mine[k] != theirs[k]] + [
            k for k in design[1] if mine["train"].get(k) != theirs["train"].get(k)]  # fmt: skip
        if differ:
            raise ConfigError(f"config key '{where}.with[{i}]': study {other!r} differs from {panel['study']!r} in "
                              f"{', '.join(differ)}: a panel draws studies of one design")  # fmt: skip
    if panel["kind"] == "divergence":
        for key in ("metric", "task"):
            if key not in panel:
                raise ConfigError(f"config key '{where}.{key}' is missing (divergence panels need it)")
        _check_subset([panel["task"]], config["divergence"]["tasks"], f"{where}.task", "divergence.tasks")


# The study grid, shared by the workflow (workflow/rules/common.smk) and the aggregation (klstudy.report.aggregate).
# One directory per cell, readable by a person: onpolicy/tiny/k1-reward/beta~0.1/seed~0
RUN_PATH = "{study}/{model}/{kl}/beta~{beta}/seed~{seed}"


def study_cells(config: dict, study: str, kl_configs: list[str] | None = None) -> list[dict]:
    """Every (model, kl, beta, seed) cell of a study, or of its ``kl_configs`` only.

    "none" (no KL penalty) is trained once per model and seed, at β = 0.
    """
    spec = config["studies"][study]
    return [
        dict(study=study, model=model, kl=kl, beta=beta, seed=seed)
        for model in spec["models"]
        for kl in kl_configs or spec["kl"]
        for beta in ([0] if kl == "none" else spec["betas"])
        for seed in spec["seeds"]
    ]


def all_cells(config: dict) -> list[dict]:
    return [cell for study in config["studies"] for cell in study_cells(config, study)]


def evaluated_cells(config: dict) -> list[dict]:
    """The cells that ``evaluation.studies`` names."""
    return [
        cell for study, kl_configs in config["evaluation"]["studies"].items()
        for cell in study_cells(config, study, kl_configs)
    ]  # fmt: skip


def evaluated_base_models(config: dict) -> list[str]:
    return sorted({model for study in config["evaluation"]["studies"] for model in config["studies"][study]["models"]})


def base_templates(config: dict) -> list[str]:
    """Chat template on, and off too when the config asks for the paper's "Baseline (No-CT)"."""
    return ["on", "off"] if config["evaluation"]["base_without_chat_template"] else ["on"]


def evaluation_settings(config: dict, study: str | None = None) -> dict:
    """The evaluation section as a cell of ``study`` is evaluated (None: a base model): its study's max_tokens
    (evaluation.study_max_tokens), and vLLM's max_model_len grown by as much, so that the prompt keeps its room."""
    settings = copy.deepcopy(config["evaluation"])
    longest = settings["study_max_tokens"].get(study, settings["max_tokens"])
    if settings["vllm"].get("max_model_len"):  # null: measured by the job from its prompts and max_tokens
        settings["vllm"]["max_model_len"] += max(0, longest - settings["max_tokens"])
    settings["max_tokens"] = longest
    return settings


def run_path(cell: dict) -> str:
    return RUN_PATH.format(**cell)


def divergence_cells(config: dict) -> list[dict]:
    """The cells that save policy snapshots for Fig. 12 (the ``divergence`` section)."""
    section = config["divergence"]
    models = section.get("models") or config["studies"][section["study"]]["models"]
    return [
        cell for cell in study_cells(config, section["study"], section["kl"])
        if cell["model"] in models and cell["beta"] in section["betas"] and cell["seed"] in section["seeds"]
    ]  # fmt: skip


def cell_settings(config: dict, study: str, model: str, kl: str, beta, seed) -> dict:
    """What `klstudy train --settings` gets for one cell of a validated config: who it is (study, model, KL
    configuration, β, seed), its name (``run``: its path, which also names it in the trackers), its study's trainer
    settings and health rules, the steps at which it saves its policy for Fig. 12 and the dtype it saves it in."""
    spec = config["studies"][study]
    run = RUN_PATH.format(study=study, model=model, kl=kl, beta=beta, seed=seed)  # β as the path writes it
    cell = dict(study=study, model=model, kl=kl, beta=float(beta), seed=int(seed))
    steps = snapshot_steps(config, cell)
    snapshot_dtype = config["divergence"]["snapshot_dtype"] if steps else None  # only a cell that saves one has it
    return dict(cell, run=run, train=spec["train"], health=spec["health"], snapshot_steps=steps,
                snapshot_dtype=snapshot_dtype)  # fmt: skip


# Keys of a study's `train` block that change how a cell is launched, watched, evaluated on held-out data or saved, not
# what it trains: a finished cell is not retrained when they change (docs/running.md, "What reruns a finished cell").
# eval_every and the held-out decoding change what heldout.jsonl holds, not the policy: a finished cell keeps the
# held-out curve it was trained with.
OPERATIONAL_TRAIN_KEYS = ("eval_every", "heldout_samples", "heldout_prompts", "heldout_decoding",
                          "checkpoint_every", "delete_checkpoints", "accelerate_config", "report_to", "wandb",
                          "trackio")  # fmt: skip


def training_settings(cell: dict) -> dict:
    """A cell's settings (cell_settings) without the operational ones: what its training depends on beside its base
    model and data, and so what Snakemake records for train_rl (workflow/rules/train.smk)."""
    return dict(cell, train={k: v for k, v in cell["train"].items() if k not in OPERATIONAL_TRAIN_KEYS})


def snapshot_steps(config: dict, cell: dict) -> list[int]:
    """Training steps at which ``cell`` saves its policy (none unless the divergence section selects it)."""
    selected = [dict(c, beta=float(c["beta"]), seed=int(c["seed"])) for c in divergence_cells(config)]
    key = dict(cell, beta=float(cell["beta"]), seed=int(cell["seed"]))
    return sorted(step for step in config["divergence"]["steps"] if step > 0) if key in selected else []


# What the workflow produces, shared by its rules (workflow/rules/common.smk) and `klstudy status`.
RUN_DIR = f"results/runs/{RUN_PATH}"
CHECKPOINT_COMPLETE = "klstudy_complete"  # a checkpoint's last file: it is complete (cell.RunRecorder.on_save)
SLICE_ENDED = "slice-ended.json"  # in a cell's checkpoint directory: its job stopped before its limit (train/slices.py)
SAVE_TOTAL_LIMIT = 2  # checkpoints a training cell keeps (cell.py hands it to Trainer; estimate.py counts them)


def checkpoints(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    """(optimiser step, directory) of every ``checkpoint-<step>`` Trainer wrote there, oldest first, complete or not."""
    found = [(path.name.removeprefix("checkpoint-"), path) for path in Path(checkpoint_dir).glob("checkpoint-*")]
    return sorted((int(step), path) for step, path in found if step.isdigit() and path.is_dir())


AGGREGATED_TABLES = ("cells", "training", "heldout", "evaluations", "divergence")  # results/tables/<name>.csv
# figures/<name>.csv and .md (tables.py)
STUDY_TABLES = ("table1", "table2", "evaluation_differences", "evaluations", "regularisation", "claims")


def evaluation_targets(config: dict) -> list[str]:
    """Every evaluated cell on every task, and every base model with (and, if asked, without) its template."""
    tasks = config["evaluation"]["tasks"]
    cells = [f"results/evals/{RUN_PATH}/{{task}}.json".format(task=task, **cell)
             for cell in evaluated_cells(config) for task in tasks]  # fmt: skip
    bases = [f"results/evals/base/{model}/template~{template}/{task}.json" for model in evaluated_base_models(config)
             for template in base_templates(config) for task in tasks]  # fmt: skip
    return cells + bases


def divergence_targets(config: dict) -> list[str]:
    """Fig. 12's forward KL and entropy: one table per selected cell and task."""
    return [f"results/divergence/{RUN_PATH}/{{task}}.csv".format(task=task, **cell)
            for cell in divergence_cells(config) for task in config["divergence"]["tasks"]]  # fmt: skip


def figure_targets(config: dict) -> list[str]:
    """The config's figures, the claims figure and each study's training figure (PNG and PDF), and the tables of the
    study (Markdown and CSV)."""
    figures = [f"figures/{name}" for name in config["figures"]] + claims_figures(config)
    return (
        ["figures/README.md"]
        + [f"{name}.{ext}" for name in figures + training_figures(config) for ext in ("png", "pdf")]
        + [f"figures/{table}.{ext}" for table in STUDY_TABLES for ext in ("md", "csv")]
    )
