"""Config validation: bad input stops before any job, with a message naming the key."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from klstudy.config import ConfigError, divergence_cells, section_settings, validate_config

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def load(name="config.yaml"):
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize("name", ["config.yaml", "config/paper.yaml", "config/pilot.yaml", "config/pilot-7b.yaml"])
def test_shipped_configs_are_valid(name):
    config = validate_config(load(name))
    assert config["toy"]["baseline"] in ("none", "rloo")


def test_defaults_are_filled_in():
    config = load()
    del config["toy"]["baseline"]
    assert validate_config(config)["toy"]["baseline"] == "none"


def set_key(config, path, value):
    *parents, last = path
    for key in parents:
        config = config[key]
    config[last] = value


def delete_key(config, path):
    *parents, last = path
    for key in parents:
        config = config[key]
    del config[last]


BAD = [
    # (what, edit, text the message must contain)
    ("unknown estimator", lambda c: set_key(c, ["toy", "estimators"], ["k1", "k9"]), "toy.estimators[1]"),
    ("unknown placement", lambda c: set_key(c, ["toy", "placements"], ["penalty"]), "toy.placements[0]"),
    ("negative beta", lambda c: set_key(c, ["studies", "onpolicy", "betas"], [-0.1, 0.1]), "studies.onpolicy.betas[0]"),
    ("missing key", lambda c: delete_key(c, ["toy", "trials"]), "'toy.trials' is missing"),
    ("missing section", lambda c: delete_key(c, ["toy"]), "'toy' is missing"),
    ("wrong type", lambda c: set_key(c, ["toy", "trials"], "200"), "toy.trials"),
    ("float where integer", lambda c: set_key(c, ["toy", "sequences"], 10.5), "toy.sequences"),
    ("unknown top-level key", lambda c: set_key(c, ["toys"], {}), "'toys' is not a known setting"),
    ("misspelt nested key", lambda c: set_key(c, ["toy", "trails"], 3), "'toy.trails' is not a known setting"),
    (
        "bad kl config",
        lambda c: set_key(c, ["studies", "onpolicy", "kl"], ["k1-reward", "k9-loss"]),
        "studies.onpolicy.kl[1]",
    ),
    (
        "undefined model",
        lambda c: set_key(c, ["studies", "onpolicy", "models"], ["gpt5"]),
        "studies.onpolicy.models[0]",
    ),
    ("alpha out of range", lambda c: set_key(c, ["toy", "alpha"], 1.5), "toy.alpha"),
    ("empty list", lambda c: set_key(c, ["toy", "lengths"], []), "toy.lengths"),
    (
        "setting lacks a parameter",
        lambda c: delete_key(c, ["toy", "settings", "close", "b_ref"]),
        "toy.settings.close.b_ref",
    ),
    ("slash in a model alias", lambda c: set_key(c, ["models", "Qwen/Qwen2.5-7B"], {"source": "x"}), "models"),
    ("negative seed", lambda c: set_key(c, ["studies", "onpolicy", "seeds"], [0, -1]), "studies.onpolicy.seeds[1]"),
    ("unknown scale", lambda c: set_key(c, ["scale"], "huge"), "scale"),
    ("duplicate length", lambda c: set_key(c, ["toy", "lengths"], [2, 2]), "toy.lengths"),
    (
        "unknown advantage",
        lambda c: set_key(c, ["studies", "onpolicy", "train", "advantage"], "ppo"),
        "studies.onpolicy.train.advantage",
    ),
    (
        "undefined training data",
        lambda c: set_key(c, ["studies", "onpolicy", "train_data"], "gsm8k"),
        "studies.onpolicy.train_data",
    ),
    (
        "undefined warm-start data",
        lambda c: set_key(c, ["models", "tiny", "warm_start_data"], {"pile": 1}),
        "models.tiny.warm_start_data.pile",
    ),
    ("unknown data kind", lambda c: set_key(c, ["data", "math_test", "kind"], "gsm8k"), "data.math_test.kind"),
    ("hub model without id", lambda c: set_key(c, ["models", "tiny"], {"source": "hub"}), "models.tiny.hub_id"),
    (
        "minibatch not dividing the batch",
        lambda c: set_key(c, ["studies", "onpolicy", "train", "minibatch_prompts"], 3),
        "studies.onpolicy.train.minibatch_prompts",
    ),
    (
        "study without train",
        lambda c: delete_key(c, ["studies", "onpolicy", "train"]),
        "'studies.onpolicy.train' is missing",
    ),
    (
        "evaluating a configuration the study does not train",
        lambda c: set_key(c, ["evaluation", "studies", "unbiased"], ["k1-reward", "k1-loss"]),
        "evaluation.studies.unbiased[1]",
    ),
    (
        "a missing accelerate config file",
        lambda c: set_key(c, ["studies", "onpolicy", "train", "accelerate_config"], "config/accelerate/nope.yaml"),
        "studies.onpolicy.train.accelerate_config",
    ),
    (
        "a micro-batch that does not divide a process's share of the minibatch (8 prompts x 4 rollouts)",
        lambda c: set_key(c, ["studies", "onpolicy", "train", "micro_batch"], 5),
        "'studies.onpolicy.train': in one process, batch_prompts must be a multiple",
    ),
    (
        "a minibatch that eight processes cannot share (fsdp.yaml; 2 prompts x 3 rollouts)",
        lambda c: c["studies"]["offpolicy_k1_loss"]["train"].update(
            accelerate_config="config/accelerate/fsdp.yaml", rollouts=3
        ),
        "'studies.offpolicy_k1_loss.train': with 8 processes (config/accelerate/fsdp.yaml), a minibatch of 6",
    ),
    (
        "figure panel with a β the study lacks",
        lambda c: set_key(c, ["figures", "fig05_eval_k1_reward_vs_k3_loss", "panels", 0, "betas"], [0.3]),
        "figures.fig05_eval_k1_reward_vs_k3_loss.panels[0].betas[0]",
    ),
    (
        "figure panel with an unknown kind",
        lambda c: set_key(c, ["figures", "fig02_k1_in_loss", "panels", 0, "kind"], "violin"),
        "figures.fig02_k1_in_loss.panels[0].kind",
    ),
    (
        "bars of a study that is not evaluated",
        lambda c: set_key(
            c,
            ["figures", "fig05_eval_k1_reward_vs_k3_loss", "panels", 0],
            {"kind": "bars", "study": "offpolicy_k1_loss", "model": "tiny"},
        ),
        "figures.fig05_eval_k1_reward_vs_k3_loss.panels[0].study",
    ),
    (
        "divergence panel without its metric",
        lambda c: delete_key(c, ["figures", "fig12_forward_kl_entropy", "panels", 0, "metric"]),
        "figures.fig12_forward_kl_entropy.panels[0].metric",
    ),
    (
        "a study's own GPUs where training jobs ask for none",
        lambda c: c["studies"]["onpolicy"].update(gpus=2),
        "studies.onpolicy.gpus",
    ),
    (
        "several greedy held-out responses per prompt (all the same)",
        lambda c: c["studies"]["onpolicy"]["train"].update(heldout_decoding="greedy", heldout_samples=2),
        "studies.onpolicy.train.heldout_samples",
    ),
    (
        "snapshot step beyond the study's steps",
        lambda c: set_key(c, ["divergence", "steps"], [0, 10, 999]),
        "divergence.steps[2]",
    ),
    (
        "gradient checkpointing twice under FSDP (transformers' Trainer would refuse it on the cluster)",
        lambda c: c["studies"]["onpolicy"]["train"].update(
            accelerate_config="config/accelerate/fsdp.yaml", gradient_checkpointing=True
        ),
        "studies.onpolicy.train.gradient_checkpointing",
    ),
    (
        "a collapse window that could never fire within the study's steps",
        lambda c: c["studies"]["unbiased"].update(health={"collapse_window": 6}),
        "studies.unbiased.health.collapse_window",
    ),
    (
        "LoRA under FSDP (adapters are merged into a whole model, which FSDP shards)",
        lambda c: c["studies"]["onpolicy"]["train"].update(
            accelerate_config="config/accelerate/fsdp.yaml", gradient_checkpointing=False, lora={"r": 4, "alpha": 8}
        ),
        "studies.onpolicy.train.lora",
    ),
    (
        "divergence on a dataset that is not staged",
        lambda c: set_key(c, ["divergence", "tasks"], ["gsm8k"]),
        "divergence.tasks[0]",
    ),
]


@pytest.mark.parametrize("what,edit,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_config_names_the_key(what, edit, expected):
    config = copy.deepcopy(load())
    edit(config)
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    assert expected in str(error.value), str(error.value)
    assert "\n" not in str(error.value), "one line, not a schema dump"


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda c: set_key(c, ["toy", "estimators"], ["k1", "k5"]), "toy.estimators[1]"),
        (lambda c: set_key(c, ["studies", "onpolicy", "betas"], [0.1, -1]), "studies.onpolicy.betas[1]"),
    ],
)
def test_snakemake_stops_before_any_job(tmp_path, edit, expected):
    config = load()
    edit(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [
            SNAKEMAKE,
            "-n",
            "--cores",
            "1",
            "--snakefile",
            str(ROOT / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert expected in run.stdout + run.stderr
    assert not (tmp_path / "results").exists()


def test_a_stage_given_part_of_its_section_gets_the_schemas_defaults(tmp_path):
    """`klstudy prepare-data` and `klstudy evaluate` run by hand with a section that lacks keys the schema defaults
    fill them, as the workflow's validation does; a key without a default is named, in one line."""
    from klstudy.data import staging
    from klstudy.run import cli

    entry = {"kind": "arithmetic", "role": "MATH train", "levels": ["add1w"], "size": 4, "seed": 0, "split": "train"}
    out = tmp_path / "x.jsonl"
    assert cli.run(["prepare-data", "--name", "x", "--settings", json.dumps(entry), "--out", str(out)]) == 0
    assert len(staging.read_jsonl(out)) == 4
    evaluation = section_settings("evaluation", {"tasks": ["math500"], "studies": {}, "k": 2})
    assert evaluation["limit"] is None and evaluation["hf"] == {"device": "auto", "dtype": "auto"}
    assert evaluation["backend"] == "hf" and evaluation["k"] == 2
    command = ["evaluate", "--model", "m", "--task", "math500", "--data-dir", "d", "--out", "o", "--samples", "s"]
    with pytest.raises(SystemExit, match="klstudy evaluate: config key 'evaluation.tasks' is missing"):
        cli.run([*command, "--settings", json.dumps({"k": 2})])


def test_the_pilot_is_the_smallest_paper_path():
    """config/pilot.yaml: one public model of at most 1.5B, K1 in the reward against K3 in the loss and no KL, one β,
    two seeds, one node per cell, MATH-500 and one MMLU subject, Fig. 12 for one cell, generation and evaluation with
    vLLM under FSDP as in config/paper.yaml."""
    pilot, paper = validate_config(load("config/pilot.yaml")), validate_config(load("config/paper.yaml"))
    (model,) = pilot["models"].values()
    assert model["source"] == "hub" and model["parameters_b"] <= 1.5
    (study,) = pilot["studies"].values()
    assert set(study["kl"]) == {"none", "k1-reward", "k3-loss"} and len(study["betas"]) == 1
    assert len(study["seeds"]) == 2 and pilot["resources"]["train"]["nodes"] == 1
    assert pilot["evaluation"]["tasks"] == ["math500", "mmlu_college_biology"]
    assert len(divergence_cells(pilot)) == 1
    same = ("generation", "accelerate_config", "advantage", "loss_type", "max_response_tokens", "rollouts")
    paper_train = paper["studies"]["onpolicy"]["train"]
    assert {k: study["train"][k] for k in same} == {k: paper_train[k] for k in same}
    assert pilot["evaluation"]["backend"] == paper["evaluation"]["backend"] == "vllm"


def test_a_studys_evaluation_length_grows_the_engine_and_leaves_the_others():
    from klstudy.config import evaluation_settings

    config = validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))
    config["evaluation"]["study_max_tokens"] = {"async_math": 5000}
    assert evaluation_settings(config, "async_math")["vllm"]["max_model_len"] is None  # measured by the job
    config["evaluation"]["vllm"]["max_model_len"] = 4096  # a length set by hand grows by as much as the answers
    longer = evaluation_settings(config, "async_math")
    assert (longer["max_tokens"], longer["vllm"]["max_model_len"]) == (5000, 4096 + 5000 - 2048)
    for study in (None, "onpolicy"):
        assert evaluation_settings(config, study) == {**config["evaluation"]}
    assert config["evaluation"]["max_tokens"] == 2048  # the config itself is left as it was


def test_an_evaluation_length_for_a_study_that_is_not_evaluated_is_refused():
    config = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config["evaluation"]["study_max_tokens"] = {"offpolicy_k1_loss": 4096}
    with pytest.raises(ConfigError, match=r"evaluation.study_max_tokens.offpolicy_k1_loss"):
        validate_config(config)


@pytest.mark.parametrize("cpus, local, expected", [(64, "8", 8), (64, None, 64), (3, "8", 1), (16, "4", 4)])
def test_a_jobs_cpus_are_shared_by_the_processes_on_its_node(cpus, local, expected):
    from klstudy.run.devices import threads_per_process

    assert threads_per_process(cpus, {"LOCAL_WORLD_SIZE": local} if local else {}) == expected


def test_a_local_copys_path_is_relative_to_the_repository_root_whatever_the_working_directory(tmp_path, monkeypatch):
    """A job of `make study RUN_DIR=…` runs in the run's directory: a relative local_dir must not follow it."""
    from klstudy.config import REPO_ROOT

    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["models"]["hubbed"] = {"source": "hub", "hub_id": "Org/Model", "local_dir": "models/Model"}
    config["models"]["absolute"] = {"source": "hub", "hub_id": "Org/Model", "local_dir": "/data/Model"}
    config["data"]["math500"] = {"kind": "math500", "hub_id": "HuggingFaceH4/MATH-500", "split": "test",
                                 "local_dir": "refdata/math500"}  # fmt: skip
    config = validate_config(config)
    assert config["models"]["hubbed"]["local_dir"] == str(REPO_ROOT / "models/Model")
    assert config["models"]["absolute"]["local_dir"] == "/data/Model"
    assert config["data"]["math500"]["local_dir"] == str(REPO_ROOT / "refdata/math500")


def test_every_claim_of_the_paper_config_can_be_judged_by_its_design():
    """Each claim of config/paper.yaml pairs at least two training seeds (both sides', and Fig. 12's); a claim naming a
    study, configuration, β or model the grid lacks is refused by validate_config itself."""
    from klstudy.config import unjudgeable_claims

    assert unjudgeable_claims(validate_config(load("config/paper.yaml"))) == {}


def test_a_claim_its_design_can_never_judge_is_named():
    from klstudy.config import unjudgeable_claims
    from klstudy.figure_plan import claim_seeds

    config = validate_config(load("config/paper.yaml"))
    config["studies"]["offpolicy_k1_reward"]["seeds"] = [0]
    config["divergence"]["seeds"] = [0]
    found = unjudgeable_claims(config)
    assert set(found) == {"k1_loss_offpolicy_below_k1_reward", "k1_reward_offpolicy_stable",
                          "forward_kl_lower_with_k3_loss", "entropy_lower_with_k1_reward"}  # fmt: skip
    assert "pairs 1 training seed ([0])" in found["forward_kl_lower_with_k3_loss"]
    config["studies"]["offpolicy_k1_loss"]["seeds"] = [1, 2]  # onpolicy trains 0, 1, 2: the two they share
    claim = config["claims"]["k1_loss_offpolicy_below_onpolicy"]
    assert claim_seeds(config, claim) == {1, 2}
    config["studies"]["onpolicy"]["seeds"] = [0, 1]
    assert claim_seeds(config, claim) == {1}
