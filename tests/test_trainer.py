"""The RL trainer against stock TRL and against hand-computed estimates, on a tiny random model on CPU."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from workflow_helpers import validated_cell

import klstudy.train.cell as grid_cell
from klstudy import kl
from klstudy.data import procedural, staging
from klstudy.train import models, slices, tiny
from klstudy.train.cell import MEASURED_COLUMNS
from klstudy.train.trainer import KLTrainer, KLTrainerConfig

GROUP = 4
BETA = 0.1
# The deep tier (`make test-deep`, docs/testing.md): every path of the trainer beyond the comparisons with stock TRL,
# the hand-computed estimates and the one tiny cell that `make test` keeps.
DEEP_TIER = pytest.mark.deep


def length_reward(completions, **kwargs):
    """A deterministic reward with spread: (characters mod 5) / 4."""
    return [(len(c[-1]["content"]) % 5) / 4 for c in completions]


PROMPTS = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(8)])


def common(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2 * GROUP,
        num_generations=GROUP,
        max_completion_length=12,
        learning_rate=1e-2,
        beta=BETA,
        use_cpu=True,
        report_to="none",
        seed=0,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        lr_scheduler_type="constant",
        loss_type="dapo",
        bf16=False,  # TRL's default is bf16 autocast, on a CPU too; the cells run float32 there (cell.trainer_config)
    )
    settings.update(overrides)
    return settings


def ours(model_dir, tmp_path, **overrides):
    return KLTrainer(
        model=str(model_dir),
        reward_funcs=length_reward,
        args=KLTrainerConfig(**common(tmp_path, **overrides)),
        train_dataset=PROMPTS,
        processing_class=models.load(model_dir)[1],
    )


def drift(trainer, scale=0.05):
    """Move the policy away from the reference (seeded), so that every KL term is non-zero. The first-step check that
    the reference is the policy's starting point would stop such a policy: it is marked done."""
    trainer._reference_checked = True
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return trainer


def stock_trl(model_dir, tmp_path, use_bias_correction_kl, scale_rewards="none"):
    """TRL's own GRPOTrainer, by default with group-mean advantages (no std scaling), as the comparison baseline."""
    return GRPOTrainer(
        model=str(model_dir),
        reward_funcs=length_reward,
        args=GRPOConfig(**common(tmp_path), scale_rewards=scale_rewards, use_bias_correction_kl=use_bias_correction_kl),
        train_dataset=PROMPTS,
        processing_class=models.load(model_dir)[1],
    )


def generation_batch():
    return [PROMPTS[i] for i in (0, 1) for _ in range(GROUP)]


def scored(trainer, seed=0):
    drift(trainer)
    trainer.model.train()
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(generation_batch())


def gradient(trainer, batch):
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by the train loop
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("advantage", sorted(kl.TRL_SCALE_REWARDS))
def test_every_normalisation_matches_stock_trl(model_dir, tmp_path, advantage):
    """Each of TRL's scale_rewards values is one of kl.ADVANTAGES: the same advantages and the same gradient as stock
    TRL 1.16 with TRL's own default KL (K3 in the loss, use_bias_correction_kl on: k3-loss-ratio)."""
    mine = ours(
        model_dir, tmp_path, kl_estimator="k3", kl_placement="loss", advantage=advantage, kl_loss_gradient="ratio"
    )
    stock = stock_trl(model_dir, tmp_path, use_bias_correction_kl=True, scale_rewards=kl.TRL_SCALE_REWARDS[advantage])
    batch_mine, batch_stock = scored(mine), scored(stock)
    assert torch.equal(batch_mine["completion_ids"], batch_stock["completion_ids"])
    rewards = torch.tensor(length_reward([[{"content": c}] for c in mine.processing_class.batch_decode(
        batch_mine["completion_ids"], skip_special_tokens=True)]))  # fmt: skip
    assert rewards.view(-1, GROUP).std(-1).min() > 0, "the test needs every group to have a spread"
    assert rewards.view(-1, GROUP).std(-1).max() != rewards.std(), "the test needs group and batch spreads to differ"
    assert torch.equal(batch_mine["advantages"], batch_stock["advantages"])  # kl._spread computes as TRL's nanstd
    loss_mine, grad_mine = gradient(mine, batch_mine)
    loss_stock, grad_stock = gradient(stock, batch_stock)
    torch.testing.assert_close(loss_mine, loss_stock, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad_mine, grad_stock, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "loss_gradient, use_bias_correction_kl", [("pathwise", False), ("ratio", True)], ids=["k3-loss", "k3-loss-ratio"]
)
def test_k3_in_loss_with_group_mean_matches_stock_trl(model_dir, tmp_path, loss_gradient, use_bias_correction_kl):
    """K3 in the loss is TRL's KL loss with use_bias_correction_kl off; k3-loss-ratio is the same with it on."""
    mine = ours(
        model_dir, tmp_path, kl_estimator="k3", kl_placement="loss", advantage="mean", kl_loss_gradient=loss_gradient
    )
    stock = stock_trl(model_dir, tmp_path, use_bias_correction_kl=use_bias_correction_kl)
    batch_mine, batch_stock = scored(mine), scored(stock)
    assert torch.equal(batch_mine["completion_ids"], batch_stock["completion_ids"])
    assert batch_stock["advantages"].abs().sum() > 0, "the test needs a reward with spread"
    mask = batch_stock["completion_mask"]
    assert "old_per_token_logps" not in batch_mine  # on-policy, KL in the loss: no extra forward pass, as TRL
    logps = _sequence_logps(mine, batch_mine).detach()
    assert kl.sequence_kl(logps, batch_stock["ref_per_token_logps"], mask, "k3").min() > 0
    torch.testing.assert_close(batch_mine["advantages"], batch_stock["advantages"])
    loss_mine, grad_mine = gradient(mine, batch_mine)
    loss_stock, grad_stock = gradient(stock, batch_stock)
    torch.testing.assert_close(loss_mine, loss_stock, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad_mine, grad_stock, rtol=1e-4, atol=1e-7)


def test_trl_default_bias_correction_would_differ(model_dir, tmp_path):
    """Why the trainer turns TRL's use_bias_correction_kl off: with it on, the gradient is not the paper's."""
    mine = ours(model_dir, tmp_path, kl_estimator="k3", kl_placement="loss", advantage="mean")
    assert mine.args.use_bias_correction_kl is False
    stock = stock_trl(model_dir, tmp_path, use_bias_correction_kl=True)
    _, grad_mine = gradient(mine, scored(mine))
    _, grad_stock = gradient(stock, scored(stock))
    assert not torch.allclose(grad_mine, grad_stock, rtol=1e-4, atol=1e-7)


def _sequence_logps(trainer, batch):
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, attention, batch["completion_ids"].size(1)
    )
    return logps


def test_k1_in_reward_gradient_is_the_score_function_estimate(model_dir, tmp_path):
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="reward", advantage="rloo")
    batch = scored(trainer)
    rewards = trainer._task_rewards[:, 0]
    mask = batch["completion_mask"].float()
    # Hand-computed, independent of kl.py: K1 = Σ_t (log π_old − log π_ref), leave-one-out baseline.
    k1 = ((batch["old_per_token_logps"] - batch["ref_per_token_logps"]) * mask).sum(1)
    shaped = (rewards - BETA * k1).view(-1, GROUP)
    baseline = (shaped.sum(1, keepdim=True) - shaped) / (GROUP - 1)
    advantages = (shaped - baseline).reshape(-1)
    torch.testing.assert_close(batch["advantages"], advantages)

    _, grad = gradient(trainer, batch)
    trainer.model.zero_grad()
    logps = _sequence_logps(trainer, batch)
    surrogate = -(advantages.unsqueeze(1) * logps * mask).sum() / mask.sum()
    surrogate.backward()
    expected = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-8)


def test_k1_in_loss_adds_the_pathwise_term(model_dir, tmp_path):
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="loss", advantage="rloo")
    batch = scored(trainer)
    loss, grad = gradient(trainer, batch)
    without = drift(ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="none", advantage="rloo"))
    base_loss, _ = gradient(without, batch)
    mask = batch["completion_mask"].float()
    # The value: the loss grows by β · (batch mean of Σ_t K1_t per token), with K1 from kl.py.
    logps = _sequence_logps(without, batch).detach()
    penalty = kl.loss_penalty(logps, batch["ref_per_token_logps"], mask, kl.KLSpec("k1", "loss", BETA))
    torch.testing.assert_close(loss - base_loss, penalty.sum() / mask.sum(), rtol=1e-4, atol=1e-7)
    # The gradient: score-function term plus β·Σ_t ∇log π_t, written by hand (one backward pass: TRL 1.16's
    # fused LM head gives gradients that are not exactly additive across separate backward passes).
    trainer.model.zero_grad()
    logps = _sequence_logps(trainer, batch)
    ratio = torch.exp(logps - logps.detach())  # on-policy: π_old = sg[π_θ]
    hand = ((-batch["advantages"].unsqueeze(1) * ratio + BETA * logps) * mask).sum() / mask.sum()
    hand.backward()
    expected = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-8)


@DEEP_TIER
@pytest.mark.parametrize("policy_loss", ["ppo_clip", "truncated_is", "masked_is"])
def test_a_stale_batch_is_weighed_by_the_chosen_policy_loss(model_dir, tmp_path, policy_loss):
    """The trainer's gradient on a batch sampled by an older policy (ω from 0.05 to 12), written by hand."""
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="reward", policy_loss=policy_loss)
    batch = scored(trainer)
    mask = batch["completion_mask"].float()
    stale = torch.tensor([0.05, 0.5, 1.0, 1.5, 6.0, 12.0]).repeat(mask.numel() // 6 + 1)[: mask.numel()]
    batch["old_per_token_logps"] = _sequence_logps(trainer, batch).detach() - stale.view_as(mask).log()
    _, grad = gradient(trainer, batch)
    trainer.model.zero_grad()
    logps = _sequence_logps(trainer, batch)
    ratio, advantages = torch.exp(logps - batch["old_per_token_logps"]), batch["advantages"].unsqueeze(1)
    if policy_loss == "ppo_clip":  # TRL's, at ε = 0.2
        per_token = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    elif policy_loss == "truncated_is":  # prime-rl until 16 October 2025
        per_token = -ratio.clamp(max=8.0) * advantages
    else:  # prime-rl after: tokens outside [1/8, 8] masked
        per_token = -ratio * advantages * ((ratio >= 0.125) & (ratio <= 8.0))
    ((per_token * mask).sum() / mask.sum()).backward()
    expected = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-8)
    # The fraction of tokens it gives no gradient, logged as TRL's clip_ratio/region_mean.
    weights = stale.view_as(mask)
    stopped = {
        "ppo_clip": ((weights < 0.8) & (advantages < 0)) | ((weights > 1.2) & (advantages > 0)),
        "truncated_is": weights > 8.0,
        "masked_is": (weights < 0.125) | (weights > 8.0),
    }[policy_loss].float()
    logged = trainer._metrics["train"]["clip_ratio/region_mean"][-1]
    assert logged == pytest.approx(((stopped * mask).sum() / mask.sum()).item()) and logged > 0


@DEEP_TIER
@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_rloo_advantages_include_the_penalty_only_in_the_reward(model_dir, tmp_path, placement):
    trainer = ours(model_dir, tmp_path, kl_estimator="k3", kl_placement=placement, advantage="rloo")
    batch = scored(trainer)
    mask = batch["completion_mask"].float()
    rewards = trainer._task_rewards[:, 0]
    if placement == "reward":
        k3 = kl.sequence_kl(batch["old_per_token_logps"], batch["ref_per_token_logps"], mask, "k3")
        rewards = rewards - BETA * k3
    groups = rewards.view(-1, GROUP)
    expected = [[groups[g, i] - (groups[g].sum() - groups[g, i]) / (GROUP - 1) for i in range(GROUP)] for g in range(2)]
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected).reshape(-1))


def _hand_group_std(rewards):
    """GRPO's ÷ group std by hand (Bessel, + 1e-4 as TRL), independent of kl.py."""
    groups = rewards.view(-1, GROUP)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).reshape(-1)


@DEEP_TIER
def test_k1_in_the_advantage_is_openrlhfs_reward_to_go_after_the_normalisation(model_dir, tmp_path):
    """OpenRLHF's KL in the reward (use_loss off): the normalised task advantage, then −β·K1 per token summed to go,
    with K1 from the sampling policy; the loss is the surrogate of those per-token advantages (by hand)."""
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="advantage", advantage="group_std")
    batch = scored(trainer)
    mask = batch["completion_mask"].float()
    k1 = (batch["old_per_token_logps"] - batch["ref_per_token_logps"]) * mask
    to_go = torch.stack([k1[:, t:].sum(1) for t in range(mask.size(1))], 1)
    expected = _hand_group_std(trainer._task_rewards[:, 0]).unsqueeze(1) - BETA * to_go
    torch.testing.assert_close(batch["advantages"], expected)
    assert float(k1.abs().sum()) > 0 and batch["advantages"].shape == mask.shape

    _, grad = gradient(trainer, batch)
    trainer.model.zero_grad()
    logps = _sequence_logps(trainer, batch)
    ratio = torch.exp(logps - logps.detach())
    (-(expected * ratio * mask).sum() / mask.sum()).backward()
    hand = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    torch.testing.assert_close(grad, hand, rtol=1e-4, atol=1e-8)


@DEEP_TIER
def test_group_whiten_whitens_every_token_after_the_penalty(model_dir, tmp_path):
    """OpenRLHF's reinforce_baseline: the group mean, the KL to go, then (A − mean)·rsqrt(var) over the batch's
    unmasked tokens (variance ÷ n), by hand."""
    trainer = ours(model_dir, tmp_path, kl_estimator="k3", kl_placement="advantage", advantage="group_whiten")
    batch = scored(trainer)
    mask = batch["completion_mask"].float()
    rewards = trainer._task_rewards[:, 0].view(-1, GROUP)
    k3 = kl.token_kl(batch["old_per_token_logps"], batch["ref_per_token_logps"], "k3") * mask
    to_go = torch.stack([k3[:, t:].sum(1) for t in range(mask.size(1))], 1)
    raw = (rewards - rewards.mean(1, keepdim=True)).reshape(-1, 1) - BETA * to_go
    mean = (raw * mask).sum() / mask.sum()
    variance = ((raw - mean).square() * mask).sum() / mask.sum()
    torch.testing.assert_close(batch["advantages"], (raw - mean) / variance.sqrt())


@DEEP_TIER
def test_beta_zero_still_measures_the_kl_to_the_reference(model_dir, tmp_path):
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="none", beta=0.0)
    assert trainer.ref_model is not None  # stock TRL loads none at β = 0
    batch = scored(trainer)
    gradient(trainer, batch)
    assert trainer._metrics["train"]["kl_k3"][-1] > 0  # drift() moved the policy away from the reference


@DEEP_TIER
@pytest.mark.parametrize("beta", [0.0, BETA])
def test_the_reference_is_built_once_by_klstudy_for_every_beta(model_dir, tmp_path, monkeypatch, beta):
    """TRL 1.16 builds its own reference for β > 0 (float32, one FSDP unit: reference.py says why not); KLTrainer's
    is reference.build's, for β = 0 too, and TRL loads the policy alone. Multi-process sharding: test_multiprocess."""
    import trl.trainer.grpo_trainer as grpo

    from klstudy.train import reference

    loaded, built = [], []
    monkeypatch.setattr(grpo, "create_model_from_path", lambda *a, **k: loaded.append(a) or _load(*a, **k))
    monkeypatch.setattr(reference, "build", lambda *a, **k: built.append(a) or _build(*a, **k))
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="reward", beta=beta)
    assert len(loaded) == 1 and len(built) == 1  # the policy, by TRL; the reference, by reference.build
    assert trainer.ref_model is not trainer.model and trainer.beta == beta == trainer.args.beta


_load = __import__("trl.trainer.grpo_trainer", fromlist=["x"]).create_model_from_path
_build = __import__("klstudy.train.reference", fromlist=["x"]).build


@DEEP_TIER
@pytest.mark.parametrize("kl_name", ["k3-loss", "k1-reward"])
def test_a_wrong_reference_stops_the_cell_at_its_first_step(model_dir, tmp_path, kl_name):
    """Before any update the policy is its reference: their log-probs agree (logged as reference_logp_gap), or the
    cell stops at step 1 naming the reference. A reference whose weights were moved stands for one loaded wrong on
    some process. On-policy K3 in the loss computes no sampling log-probs of its own: the check computes them."""
    spec = kl.KLSpec.from_name(kl_name, BETA)
    settings = dict(kl_estimator=spec.estimator, kl_placement=spec.placement, max_steps=1)
    right = ours(model_dir, tmp_path / "right", **settings)
    right.train()
    gaps = [row["reference_logp_gap"] for row in right.state.log_history if "reference_logp_gap" in row]
    assert len(gaps) == 1 and gaps[0] < 1e-5, gaps  # float32 forwards of the same weights
    wrong = ours(model_dir, tmp_path / "wrong", **settings)
    with torch.no_grad():
        for parameter in wrong.ref_model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    with pytest.raises(RuntimeError, match="the reference model is not the policy's base model on process 0"):
        wrong.train()
    assert wrong.state.global_step == 0  # no update was made


@DEEP_TIER
def test_updates_per_batch_takes_that_many_optimiser_steps_per_generation(model_dir, tmp_path):
    trainer = ours(
        model_dir,
        tmp_path,
        kl_estimator="k1",
        kl_placement="reward",
        per_device_train_batch_size=GROUP,
        updates_per_batch=4,
        max_steps=8,
    )
    trainer.train()
    assert trainer.state.global_step == 8
    assert [g["trained_step"] for g in trainer.generation_log] == [0, 1]  # two generation batches for 8 steps
    assert trainer.args.generation_batch_size == 4 * GROUP


@DEEP_TIER
def test_async_level_trains_on_batches_generated_k_steps_earlier(model_dir, tmp_path):
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="reward", async_level=2, max_steps=6)
    trainer.train()
    log = trainer.generation_log
    assert [g["trained_step"] for g in log] == list(range(6))
    assert [g["policy_step"] for g in log] == [max(0, t - 2) for t in range(6)]
    # Nothing is generated for steps after the last: the last two steps train on batches made earlier.
    assert trainer._lookahead_drawn == 6 and not trainer._fifo
    # Every step logs the reward and KL of the batch it trained on, also the last two.
    logged = [entry for entry in trainer.state.log_history if "staleness" in entry]
    assert len(logged) == 6 and all("task_reward" in entry and "kl_k3" in entry for entry in logged)


@DEEP_TIER
def test_async_level_beyond_the_run_generates_only_the_batches_it_trains_on(model_dir, tmp_path):
    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="reward", async_level=4, max_steps=2)
    trainer.train()
    assert [(g["trained_step"], g["policy_step"]) for g in trainer.generation_log] == [(0, 0), (1, 0)]
    assert trainer._lookahead_drawn == 2 and not trainer._fifo


@DEEP_TIER
def test_the_lookahead_draws_the_training_loop_order_across_epochs_and_after_a_resume(model_dir, tmp_path):
    """The asynchronous look-ahead draws prompt batches in the order the training loop would (epoch e's order set by
    set_epoch(e), different from epoch to epoch), also when it restarts at a restored position."""

    def prompts(batch):
        return [row["prompt"][0]["content"] for row in batch]

    trainer = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="reward", async_level=2)
    dataloader = trainer.get_train_dataloader()
    epochs = []
    for epoch in range(3):
        dataloader.set_epoch(epoch)
        epochs.append([prompts(batch) for batch in dataloader])
    assert epochs[0] != epochs[1] != epochs[2]
    expected = [batch for epoch in epochs for batch in epoch]
    assert [prompts(trainer._next_lookahead_prompts()) for _ in expected] == expected
    resumed = ours(model_dir, tmp_path, kl_estimator="k1", kl_placement="reward", async_level=2)
    resumed._lookahead_drawn = len(epochs[0]) + 1  # as _load_optimizer_and_scheduler restores it
    assert [prompts(resumed._next_lookahead_prompts()) for _ in expected[len(epochs[0]) + 1 :]] == expected[
        len(epochs[0]) + 1 :
    ]


# ------------------------------------------------------------------------------ the `klstudy train` command


def _cell(steps=6, health=None, snapshot_steps=(), snapshot_dtype="base", **train):
    settings = dict(
        steps=steps,
        batch_prompts=2,
        minibatch_prompts=2,
        rollouts=GROUP,
        learning_rate=1e-2,
        max_response_tokens=12,
        temperature=1.0,
        advantage="rloo",
        loss_type="token_sum",
        async_level=0,
        eval_every=3,
        checkpoint_every=2,
    )
    settings.update(train)
    # K1 in the loss moves an untrained policy from the first step (β·∇log π ≠ 0 even at π = π_ref), so the
    # trajectories compared below are not trivially constant.
    return validated_cell(settings, kl="k1-loss", beta=BETA, health=health, snapshot_steps=snapshot_steps,
                          snapshot_dtype=snapshot_dtype)  # fmt: skip


def _command(model_dir, data_dir, out, checkpoints, cell):
    return [
        sys.executable,
        "-m",
        "klstudy",
        "train",
        "--settings",
        json.dumps(cell),
        "--model",
        str(model_dir),
        "--train-data",
        str(data_dir / "train.jsonl"),
        "--heldout-data",
        str(data_dir / "heldout.jsonl"),
        "--out",
        str(out),
        "--checkpoints",
        str(checkpoints),
        "--tracking-dir",
        str(Path(checkpoints).parent / "tracking"),
        "--threads",
        "1",
    ]


def _env():
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


@DEEP_TIER
def test_a_killed_run_resumes_from_its_checkpoint_and_ends_like_an_uninterrupted_one(model_dir, data_dir, tmp_path):
    """The suite's cell-level resume (the killed workflow's: tests/test_resume.py). Asynchronous, so the look-ahead's
    batches resume too; the on-policy loop restores the same trainer state with none of them."""
    cell = _cell(async_level=2, delete_checkpoints=False, snapshot_steps=[2, 6])  # before the kill, after
    reference = tmp_path / "reference"
    subprocess.run(_command(model_dir, data_dir, reference, tmp_path / "ref-ckpt", cell), check=True, env=_env())

    out, checkpoints = tmp_path / "killed", tmp_path / "ckpt"
    killed = subprocess.run(
        _command(model_dir, data_dir, out, checkpoints, cell), env={**_env(), "KLSTUDY_KILL_AT_STEP": "5"}
    )
    assert killed.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    assert [row["step"] for row in staging.read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    # Snakemake deletes a failed job's outputs: the resumed run must not need them.
    shutil.rmtree(out)
    # A job killed while saving leaves a partial checkpoint, as one killed at its time limit did in CI: weights,
    # optimiser and RNG state but no trainer_state.json. Never resume from it.
    partial = shutil.ignore_patterns("trainer_state.json", "*.jsonl", grid_cell.CHECKPOINT_COMPLETE)
    shutil.copytree(checkpoints / "checkpoint-4", checkpoints / "checkpoint-6", ignore=partial)
    subprocess.run(_command(model_dir, data_dir, out, checkpoints, cell), check=True, env=_env())

    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"].endswith("checkpoint-4")
    ignore = set(MEASURED_COLUMNS)
    resumed = [{k: v for k, v in row.items() if k not in ignore} for row in staging.read_jsonl(out / "metrics.jsonl")]
    expected = [
        {k: v for k, v in row.items() if k not in ignore} for row in staging.read_jsonl(reference / "metrics.jsonl")
    ]
    assert [row["step"] for row in resumed] == list(range(1, 7))
    assert resumed == expected
    assert staging.read_jsonl(out / "heldout.jsonl") == staging.read_jsonl(reference / "heldout.jsonl")
    # Fig. 12's snapshots survive the kill (they wait beside the checkpoints) and equal the uninterrupted run's.
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == ["step~2", "step~6"]
    for step in (2, 6):
        assert _weights(out / "snapshots" / f"step~{step}") == _weights(reference / "snapshots" / f"step~{step}")
    assert _weights(out / "snapshots" / "step~6") == _weights(out / "final")
    assert _weights(out / "snapshots" / "step~2") != _weights(out / "final")


@DEEP_TIER
def test_a_run_warned_of_its_jobs_end_goes_on_in_the_next_slice_like_an_uninterrupted_one(
    model_dir, data_dir, tmp_path
):
    """A job that gets SLURM's warning (SIGUSR1, here sent by the trainer itself during step 1) stops after that step
    with a checkpoint there (not a multiple of checkpoint_every), writes no outputs and leaves the slice mark; the
    next slice clears the mark and ends with the metrics of an uninterrupted run. Asynchronous: the look-ahead
    batches resume too."""
    cell = _cell(async_level=2, delete_checkpoints=False)
    subprocess.run(_command(model_dir, data_dir, tmp_path / "ref", tmp_path / "ref-ckpt", cell), check=True, env=_env())
    out, checkpoints = tmp_path / "sliced", tmp_path / "ckpt"
    warned = {**_env(), "KLSTUDY_WARN_AT_STEP": "1"}
    first = subprocess.run(_command(model_dir, data_dir, out, checkpoints, cell), env=warned, check=True,
                           capture_output=True, text=True)  # fmt: skip
    assert "unfinished after 1 steps" in first.stdout, first.stdout[-2000:]
    assert not (out / "summary.json").exists() and not (out / "final").exists()
    assert json.loads((checkpoints / slices.SLICE_ENDED).read_text()) == {"step": 1}
    assert (checkpoints / "checkpoint-1" / grid_cell.CHECKPOINT_COMPLETE).exists()

    subprocess.run(_command(model_dir, data_dir, out, checkpoints, cell), check=True, env=_env())
    assert not (checkpoints / slices.SLICE_ENDED).exists()
    assert json.loads((out / "summary.json").read_text())["resumed_from"].endswith("checkpoint-1")
    ignore = set(MEASURED_COLUMNS)
    runs = [[{k: v for k, v in row.items() if k not in ignore} for row in staging.read_jsonl(d / "metrics.jsonl")]
            for d in (tmp_path / "ref", out)]  # fmt: skip
    assert [row["step"] for row in runs[1]] == list(range(1, 7)) and runs[0] == runs[1]
    assert staging.read_jsonl(out / "heldout.jsonl") == staging.read_jsonl(tmp_path / "ref" / "heldout.jsonl")


def _weights(model_dir):
    from safetensors.torch import load_file

    return {name: tensor.tolist() for name, tensor in load_file(str(model_dir / "model.safetensors")).items()}


def test_a_diverging_run_is_recorded_not_raised(model_dir, data_dir, tmp_path):
    cell = _cell(steps=4, learning_rate=1.0, health={"max_kl": 1e-6}, checkpoint_every=1)
    subprocess.run(_command(model_dir, data_dir, tmp_path / "cell", tmp_path / "ckpt", cell), check=True, env=_env())
    summary = json.loads((tmp_path / "cell" / "summary.json").read_text())
    assert summary["status"] == "diverged" and "max_kl" in summary["reason"]
    assert 1 < summary["steps_done"] < 4  # two checkpoints were written (save_total_limit keeps two)
    # A cell that stopped early keeps its last checkpoint (to inspect or continue it), and no other.
    kept = [path.name for _, path in grid_cell.checkpoints(tmp_path / "ckpt")]
    assert kept == [f"checkpoint-{summary['steps_done']}"], kept
    assert summary["base_model_sha256"] == models.weights_digest(model_dir)  # which base model, to the bit
    assert (tmp_path / "cell" / "final" / "config.json").is_file()


@DEEP_TIER
def test_lora_cell_trains_and_saves_a_merged_model(model_dir, data_dir, tmp_path):
    cell = _cell(steps=2, lora={"r": 4, "alpha": 8})
    subprocess.run(_command(model_dir, data_dir, tmp_path / "cell", tmp_path / "ckpt", cell), check=True, env=_env())
    assert json.loads((tmp_path / "cell" / "summary.json").read_text())["status"] == "ok"
    final, _ = models.load(tmp_path / "cell" / "final")
    base, _ = models.load(model_dir)
    assert not (tmp_path / "cell" / "final" / "adapter_config.json").exists()
    changed = [name for name, p in final.state_dict().items() if not torch.equal(p, base.state_dict()[name])]
    assert changed and all("embed" not in name for name in changed)  # LoRA touched the linear layers only


def _history(rewards, **extra):
    return [{"step": i + 1, "task_reward": r, "loss": 0.1, "grad_norm": 1.0, "kl_k1": 0.1, "kl_k3": 0.1, **extra}
            for i, r in enumerate(rewards)]  # fmt: skip


def test_health_rules_name_collapse_divergence_and_leave_healthy_runs_alone():
    from klstudy.train.cell import HealthRules

    rules = HealthRules(max_kl=50, collapse_window=3, collapse_fraction=0.2, collapse_min_best=0.05)
    assert rules.verdict(_history([0.3, 0.4, 0.5, 0.45, 0.5, 0.4, 0.35])) is None
    status, reason = rules.verdict(_history([0.3, 0.4, 0.5, 0.5, 0.1, 0.0, 0.0]))
    assert status == "collapsed" and "best 0.467" in reason
    assert rules.verdict(_history([0.0, 0.01, 0.0, 0.0, 0.0, 0.0])) is None  # never learned: not a collapse
    assert rules.verdict(_history([0.3, 0.3], kl_k3=float("nan")))[0] == "diverged"
    assert rules.verdict(_history([0.3, 0.3], loss=float("inf")))[0] == "diverged"
    assert rules.verdict(_history([0.3, 0.3], kl_k3=60.0))[0] == "diverged"
    # Several updates per batch: only the generating update logs a reward; the others must not break the rule.
    interleaved = [row for h in _history([0.3, 0.4, 0.5, 0.5, 0.1, 0.0, 0.0]) for row in (h, _without_reward(h))]
    assert rules.verdict(interleaved)[0] == "collapsed"
    assert rules.verdict(interleaved[:7]) is None


def _without_reward(row):
    return {key: value for key, value in row.items() if key != "task_reward"}


@pytest.mark.parametrize(
    "processes,micro,expected",
    [(1, None, (40, 1)), (1, 8, (8, 5)), (4, None, (10, 1)), (4, 5, (5, 2)), (8, 5, (5, 1))],
)
def test_a_minibatch_is_split_over_processes_then_micro_batches(processes, micro, expected):
    from klstudy.config import batch_layout

    train = dict(batch_prompts=8, minibatch_prompts=8, rollouts=5, **({"micro_batch": micro} if micro else {}))
    assert batch_layout(train, processes) == expected
    per_device, accumulation = expected
    assert per_device * accumulation * processes == 40  # one optimiser step = the whole minibatch
    with pytest.raises(ValueError, match="cannot be split over 3 processes"):
        batch_layout(train, 3)


@pytest.mark.parametrize("requests,processes", [(7, 2), (14, 2), (3, 4), (64, 8), (5, 1)])
def test_each_heldout_request_is_generated_by_one_process_in_calls_of_one_size(requests, processes):
    shares = [grid_cell.process_share(requests, index, processes) for index in range(processes)]
    owned = [i for mine, _ in shares for i in mine]
    assert owned == list(range(requests))  # each request once, in order when gathered process by process
    assert len({len(padded) for _, padded in shares}) == 1  # the same generate calls on every process
    assert all(padded[: len(mine)] == mine for mine, padded in shares)


@DEEP_TIER
@pytest.mark.parametrize("snapshot_dtype, snapshot_tensors", [("base", "BF16"), ("float32", "F32")])
def test_a_bfloat16_base_model_gives_bfloat16_finals_and_snapshots(
    data_dir, tmp_path, snapshot_dtype, snapshot_tensors
):
    """The policy trains in float32 weights (TRL's default); what it hands on has the base model's dtype, and so do
    Fig. 12's snapshots unless divergence.snapshot_dtype is float32 (the weights as trained)."""
    from transformers import AutoModelForCausalLM

    spec = tiny.TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128, sft_steps=0)
    tokenizer = tiny.build_tokenizer()
    base = tiny.build_model(spec, tokenizer).to(torch.bfloat16)
    base.config.dtype = "bfloat16"
    tiny.save(base, tokenizer, tmp_path / "base", spec, {})
    cell = _cell(steps=2, snapshot_steps=[1], snapshot_dtype=snapshot_dtype)
    command = _command(tmp_path / "base", data_dir, tmp_path / "cell", tmp_path / "ckpt", cell)
    subprocess.run(command, check=True, env=_env())
    expected = {"final": ("bfloat16", "BF16"), "step~1": ({"BF16": "bfloat16", "F32": "float32"}[snapshot_tensors],
                                                         snapshot_tensors)}  # fmt: skip
    for saved in (tmp_path / "cell" / "final", tmp_path / "cell" / "snapshots" / "step~1"):
        dtype, tensors = expected[saved.name]
        assert json.loads((saved / "config.json").read_text())["dtype"] == dtype
        assert {t["dtype"] for t in models.saved_tensors(saved).values()} == {tensors}
        loaded = AutoModelForCausalLM.from_pretrained(saved, dtype="auto")
        assert loaded.dtype == getattr(torch, dtype)
        assert not torch.equal(loaded.model.embed_tokens.weight.float(), base.model.embed_tokens.weight.float())


@DEEP_TIER
def test_a_save_that_wrote_no_weights_fails_the_job_instead_of_recording_ok(model_dir, data_dir, tmp_path, monkeypatch):
    """Under FSDP's SHARDED_STATE_DICT, Trainer.save_model writes the tokenizer and no weights; the job must fail."""

    def tokenizer_only(trainer, path, dtype, keep_training=False):
        trainer.processing_class.save_pretrained(str(path))

    monkeypatch.setattr(grid_cell, "save_policy", tokenizer_only)
    out = tmp_path / "cell"
    with pytest.raises(models.SavedModelError, match="final: no config.json"):
        paths = (data_dir / "train.jsonl", data_dir / "heldout.jsonl", out, tmp_path / "checkpoints", tmp_path)
        grid_cell.run(_cell(steps=1), model_dir, *paths)
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize(
    "setting",
    [
        {"scale_rewards": "group"},
        {"num_iterations": 2},
        {"use_bias_correction_kl": True},
        {"steps_per_generation": 3},
    ],  # fmt: skip
)
def test_a_setting_the_trainer_fixes_is_refused_not_overwritten(tmp_path, setting):
    with pytest.raises(ValueError, match=f"{next(iter(setting))}="):
        KLTrainerConfig(**common(tmp_path, **setting))
    fixed = KLTrainerConfig(**common(tmp_path))
    assert (fixed.scale_rewards, fixed.num_iterations, fixed.use_bias_correction_kl) == ("none", 1, False)


def test_a_collapse_window_of_zero_turns_the_collapse_rule_off():
    from klstudy.train.cell import HealthRules

    off = HealthRules(max_kl=50, collapse_window=0, collapse_fraction=0.2, collapse_min_best=0.05)
    assert off.verdict(_history([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])) is None
    assert off.verdict(_history([0.5, 0.5], kl_k3=60.0))[0] == "diverged"  # the other rules still hold


@DEEP_TIER
def test_greedy_generation_is_the_same_whatever_the_seed_and_sampling_comes_back(model_dir, tmp_path):
    """train.heldout_decoding greedy: the held-out pass decodes greedily (the same responses under any seed), and the
    rollouts after it sample again (transformers' path; vLLM's temperature is set alike, tests/test_vllm.py)."""
    trainer = ours(model_dir, tmp_path, temperature=1.0)
    prompts = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(4)]

    def completions(seed, greedy):
        torch.manual_seed(seed)
        with trainer.greedy_generation() if greedy else contextlib.nullcontext():
            return trainer._generate(prompts)[1]

    assert completions(0, greedy=True) == completions(1, greedy=True)
    assert completions(0, greedy=False) != completions(1, greedy=False)
    assert trainer.generation_config.do_sample and trainer.generation_kwargs["do_sample"]
    records = procedural.arithmetic("h", 4, 0, ["add1"], "heldout")
    runs = [grid_cell.heldout_pass_at_1(trainer, records, seed=seed, greedy=True)["per_prompt"] for seed in (0, 1)]
    assert runs[0] == runs[1]
