"""The RL trainer: TRL's GRPOTrainer with every KL configuration of the paper, on- and off-policy.

What changes with respect to stock TRL 1.16 (and only this; generation, vLLM, reward calls, logging,
checkpointing and distributed training are TRL's own; on a CPU, vllm_cpu.py adapts TRL's colocated vLLM):

1. Advantages (``_generate_and_score_completions``). The task reward R of each response is shaped by the
   KL when the KL is placed in the reward, R − β·Σ_t sg[K_t], with K_t computed from the log-probs of the
   policy that *sampled* the response, at sampling time (eq. 7); then the baseline is RLOO
   (A_i = R_i − mean_{j≠i} R_j, the paper's choice), the group mean (TRL's GRPO with ``scale_rewards="none"``;
   Dr. GRPO), or the group mean divided by the group's (``group_std``: TRL's "group", its default) or the batch's
   (``batch_std``: TRL's "batch") standard deviation. All of it comes from ``kl.py``.
2. Loss (``_compute_loss``). TRL's clipped surrogate −min(ω·A, clip(ω)·A) per token, or prime-rl's truncated or
   masked importance weight (``policy_loss``), plus the KL term β·K_t(θ) when the KL is placed in the loss,
   differentiated path-wise (the paper's) or as a framework does (``kl_loss_gradient``: kl.py), normalised like
   TRL's ``dapo`` (all completion tokens of the generation batch: the paper's token-sum normalisation) or
   ``dr_grpo``. TRL's ``use_bias_correction_kl`` is off; ``kl_loss_gradient="ratio"`` is the same term.
3. Asynchrony (``async_level = k``). A FIFO of generation batches: the batch trained at step t was
   generated and scored (old log-probs, reward KL, advantages) at step max(0, t − k) by the policy of that
   time, as prime-rl's orchestrator did until November 2025 (it waits for checkpoint t − k once k steps ahead).
   Prompts are drawn k batches ahead, so every batch still sees each prompt once per epoch. A step logs the
   reward, KL and length of the batch it trains on (with its staleness); the last k steps generate nothing,
   since their batches would be trained after the run.

Per-step metrics always include the KL between the sampling policy and the reference, estimated with
K1 and K3 per sequence (a reference model is loaded even when β = 0, to measure it). The reference is built by
reference.py, for every β (TRL's own, for β > 0, is not sharded per layer under FSDP2), and checked at the first
step: before any update, the policy's and the reference's log-probs of the sampled tokens must agree.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate.utils import is_peft_model
from torch.utils.data import Sampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import get_config_model_id, use_adapter

from klstudy import kl
from klstudy.train import reference, vllm_cpu

# The paper's "normalisation by the total number of tokens in the sampled response batch" is what TRL
# calls dapo; Dr. GRPO (the asynchronous study) divides by batch size × max completion length.
LOSS_TYPES = {"token_sum": "dapo", "dr_grpo": "dr_grpo"}
TRAINER_ADVANTAGES = tuple(name for name in kl.ADVANTAGES if name != "none")  # a baseline is always subtracted


@dataclass
class KLTrainerConfig(GRPOConfig):
    """GRPOConfig plus the design choices the paper studies.

    ``beta`` (GRPOConfig's) is the KL coefficient β of the configuration, and TRL's default is 0.0: set it, or a KL
    configuration trains with no KL at all. ``kl_estimator`` and ``kl_placement`` default to GRPOTrainer's KL term (K3
    in the loss, path-wise), biased by the paper's Table 1; the study recommends ``kl_estimator='k1',
    kl_placement='reward'`` with the default ``advantage='rloo'`` (docs/analysis.md). ``loss_type`` is ``dapo``
    (token-sum normalisation over the generation batch, the paper's on-policy setting) or ``dr_grpo``.
    ``per_device_train_batch_size`` counts completions, as in TRL.
    """

    kl_estimator: str | None = field(
        default="k3",
        metadata={"help": f"Token-level KL estimator, one of kl.ESTIMATORS ({', '.join(kl.ESTIMATORS)}); None with "
                  "placement none."},  # fmt: skip
    )
    kl_placement: str = field(
        default="loss",
        metadata={
            "help": "Where the KL goes: reward (R − β·Σ sg[K_t]), loss (+β·K_t), both, advantage (−β·Σ_{s≥t} sg[K_s] "
            "per token after the normalisation: OpenRLHF, AReaL), or none."
        },
    )
    advantage: str = field(
        default="rloo",
        metadata={
            "help": "Advantage normalisation, one of kl.ADVANTAGES: rloo (the paper's), mean (Dr. GRPO's), group_std "
            "(GRPO's; TRL's default), batch_std, loo_std, group_whiten or whiten (docs/glossary.md says each)."
        },
    )
    updates_per_batch: int = field(
        default=1,
        metadata={
            "help": "Optimiser steps per generation batch, each on its own minibatch (1 = on-policy; the paper's "
            "off-policy variants use 4). Sets TRL's steps_per_generation."
        },
    )
    async_level: int = field(
        default=0,
        metadata={"help": "k ≥ 0: the batch trained at step t was generated at step t − k (FIFO of batches)."},
    )
    kl_loss_gradient: str = field(
        default="pathwise",
        metadata={
            "help": "How the loss term β·K_t is differentiated (kl.LOSS_GRADIENTS): pathwise (the paper's), ratio "
            "(× π_θ/π_old, TRL's use_bias_correction_kl, slime; Zhang et al. 2025), score (NeMo-RL), st (verl "
            "k1+/k3+) or isst (OpenRLHF unbiased_gradient)."
        },
    )
    policy_loss: str = field(
        default="ppo_clip",
        metadata={
            "help": "How a token sampled by an older policy is weighed (kl.POLICY_LOSSES): ppo_clip (TRL's clipped "
            "surrogate), truncated_is (prime-rl to Oct. 2025: −min(ω, 8)·A) or masked_is (prime-rl since: −ω·A, "
            "tokens with ω outside [1/8, 8] masked)."
        },
    )
    kl_clamp: float | None = field(
        default=None,
        metadata={
            "help": "The estimator's per-token value clamped to ±this in the penalty (the frameworks' clamps: "
            "pitfalls.md); None: not. A study sets it from `train.k3_clamp`, for K3 only."
        },
    )
    measure_reference_kl: bool = field(
        default=True,
        metadata={"help": "Load the reference model even when β = 0, to log the K1 and K3 KL estimates."},
    )
    # GRPOConfig's settings that this trainer fixes: their defaults here are the only values it accepts.
    num_iterations: int = field(default=1, metadata={"help": "Fixed at 1: updates_per_batch sets off-policy updates."})
    scale_rewards: str = field(default="none", metadata={"help": "Fixed at none: the advantages are kl.ADVANTAGES'."})
    use_bias_correction_kl: bool = field(
        default=False, metadata={"help": "Fixed at False: TRL 1.16's True changes the gradient of K3 in the loss."}
    )
    steps_per_generation: int | None = field(
        default=None, metadata={"help": "Set from updates_per_batch × gradient_accumulation_steps (None: so set)."}
    )

    FIXED = ("num_iterations", "scale_rewards", "use_bias_correction_kl")  # their defaults above are required

    def kl_spec(self) -> kl.KLSpec:
        return kl.KLSpec(
            self.kl_estimator, self.kl_placement, float(self.beta), self.kl_loss_gradient, clamp=self.kl_clamp
        )

    def __post_init__(self):
        self.kl_spec()  # the one check of a KL configuration
        if self.policy_loss not in kl.POLICY_LOSSES:
            raise ValueError(f"policy_loss {self.policy_loss!r} is not one of {kl.POLICY_LOSSES}")
        if self.advantage not in TRAINER_ADVANTAGES:
            raise ValueError(f"advantage {self.advantage!r} is not one of {TRAINER_ADVANTAGES}")
        if self.loss_type not in LOSS_TYPES.values():
            raise ValueError(f"loss_type {self.loss_type!r}: this trainer supports {sorted(LOSS_TYPES.values())}")
        if self.updates_per_batch < 1 or self.async_level < 0:
            raise ValueError("updates_per_batch must be >= 1 and async_level >= 0")
        for name in self.FIXED:  # as TRL's own config does with conflicting settings: say so, overwrite nothing
            value, required = getattr(self, name), self.__dataclass_fields__[name]
            if value != required.default:
                why = required.metadata["help"]
                raise ValueError(f"{name}={value!r}: KLTrainerConfig needs {required.default!r} ({why})")
        # One generation batch = updates_per_batch minibatches, each of gradient_accumulation_steps micro-batches.
        steps = self.updates_per_batch * self.gradient_accumulation_steps
        if self.steps_per_generation not in (None, steps):
            raise ValueError(
                f"steps_per_generation={self.steps_per_generation}: KLTrainerConfig sets it to updates_per_batch × "
                f"gradient_accumulation_steps = {steps}; set updates_per_batch instead"
            )
        self.steps_per_generation = steps
        super().__post_init__()


# What KLTrainer logs beside TRL's own metrics (loss, reward, completions/…): docs/trainer-config.md lists them.
LOGGED_METRICS = {
    "task_reward": "the generation batch's mean task reward, before any KL penalty",
    "reward_kl_penalty": "the mean of β·Σ_t sg[K_t] subtracted from the reward (0 without the KL in the reward)",
    "kl_k1": "KL(π_sampling ‖ π_ref) per sequence, estimated with K1 (Σ_t log π/π_ref), whatever the configuration",
    "kl_k3": "the same KL estimated with K3 (Σ_t r − 1 − log r)",
    "entropy": "the mean per-token entropy of the policy on the trained tokens",
    "clip_ratio/region_mean": "the share of tokens the policy loss gives no gradient (clipped, truncated or masked)",
    "generation_time": "seconds to generate and score one generation batch",
    "staleness": "steps between the policy that generated the trained batch and the one trained (async_level)",
    "reference_logp_gap": "first step only: mean |log π_θ − log π_ref| a sampled token, before any update (the "
    "largest over processes; ~0 when the reference is the policy's base model: reference.py)",
}


class EpochSeededSampler(Sampler):
    """TRL's RepeatSampler with each epoch's order a function of (seed, epoch) alone.

    RepeatSampler draws every epoch's permutation from one generator seeded once, so a run resumed from a checkpoint
    (which builds a new sampler) would see epoch e ≥ 2 in epoch 1's order. The Trainer calls ``set_epoch(e)``
    before every epoch, after a resume too, and the asynchronous look-ahead does the same; epoch 0 is RepeatSampler's
    own first order.
    """

    def __init__(self, sampler):
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        if self.sampler.shuffle:
            self.sampler.generator.manual_seed((self.sampler.seed or 0) + epoch)

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self):
        return len(self.sampler)


@contextlib.contextmanager
def _without_trl_reference(args: KLTrainerConfig, model):
    """GRPOTrainer.__init__ with β read as 0: TRL then builds no reference of its own (its β is used nowhere else
    there); KLTrainer builds it (reference.py) and sets β back. A model that already holds PEFT adapters is left to
    TRL, which copies its adapter as the reference ("ref")."""
    beta = args.beta
    if isinstance(model, torch.nn.Module) and is_peft_model(model):
        yield
        return
    args.beta = 0.0
    try:
        yield
    finally:
        args.beta = beta


class KLTrainer(GRPOTrainer):
    """GRPOTrainer whose KL estimator, placement, baseline and asynchrony follow ``KLTrainerConfig``."""

    def __init__(self, model, reward_funcs, args: KLTrainerConfig, **kwargs):
        colocated_on_cpu = args.use_vllm and args.vllm_mode == "colocate" and vllm_cpu.on_cpu()
        engine = vllm_cpu.colocated_engine() if colocated_on_cpu else contextlib.nullcontext()
        with engine, _without_trl_reference(args, model):
            super().__init__(model, reward_funcs, args, **kwargs)
        self.beta = args.beta  # TRL computes the reference's log-probs in scoring when β ≠ 0
        if colocated_on_cpu:  # vLLM's CPU backend needs its own weight sync (vllm_cpu.py); GPUs keep TRL's
            vllm_cpu.adapt_trl_generation(self.vllm_generation)
        self.kl_spec = self.args.kl_spec()
        if (args.beta != 0 or self.args.measure_reference_kl) and not self._uses_peft():
            self.ref_model = self._load_reference_model()
        self._reference_checked = False  # the first-step agreement of policy and reference (reference.py)
        self._fifo: collections.deque = collections.deque()
        self._lookahead = None  # iterator over prompt batches, async_level batches ahead of the training loop
        self._lookahead_drawn = 0  # prompt batches drawn from the look-ahead iterator, restored on resume
        self.generation_log: list[dict] = []  # (trained step, policy step that generated it) of every batch

    # ------------------------------------------------------------------------------ reference model

    def _uses_peft(self) -> bool:
        return is_peft_model(self.accelerator.unwrap_model(self.model))

    def _load_reference_model(self):
        model = self.accelerator.unwrap_model(self.model)
        return reference.build(
            get_config_model_id(model.config),
            self.accelerator,
            model.dtype,
            attn_implementation=model.config._attn_implementation,
            temperature=self.temperature,
            cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
        )

    def _logps(self, model, batch: dict) -> torch.Tensor:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                batch["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        return logps

    def _reference_logps(self, batch: dict) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logps(self.ref_model, batch)
        model = self.accelerator.unwrap_model(self.model)  # PEFT: the base model is the reference
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._logps(self.model, batch)

    # ------------------------------------------------------------------------------ rewards and advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._task_rewards = rewards_per_func  # gathered over processes; weighted below
        return rewards_per_func

    def _score_batch(self, inputs) -> dict:
        """Generate, score and compute advantages for one generation batch, with the current policy."""
        start = time.perf_counter()
        batch = super()._generate_and_score_completions(inputs)
        # Generation and scoring apart (TRL's step_time holds both and the update), so that each can be timed.
        self._metrics["train"]["generation_time"].append(time.perf_counter() - start)
        mask = batch["completion_mask"].float()
        if "old_per_token_logps" not in batch and self._needs_sampling_logps():
            # The sampling policy's log-probs, for the reward KL and for later (off-policy) updates. On-policy
            # with the KL in the loss only, TRL's shortcut (π_old = sg[π_θ] in the loss) saves this forward pass.
            batch["old_per_token_logps"] = self._logps(self.model, batch)
        if "ref_per_token_logps" not in batch and (self.ref_model is not None or self._uses_peft()):
            batch["ref_per_token_logps"] = self._reference_logps(batch)
        if not self._reference_checked and "ref_per_token_logps" in batch:
            self._check_reference(batch, mask)
        weights = self.reward_weights.to(self._task_rewards.device)
        task_rewards = (self._task_rewards * weights).nansum(dim=1)  # (global batch,)
        penalty = torch.zeros_like(mask[:, 0])
        if "old_per_token_logps" in batch and "ref_per_token_logps" in batch:
            sampling_logps, ref = batch["old_per_token_logps"], batch["ref_per_token_logps"]
            penalty = kl.reward_penalty(sampling_logps, ref, mask, self.kl_spec)
            self._log_sequence_kl(sampling_logps, ref, mask)
        penalty = self.accelerator.gather(penalty)
        groups = (task_rewards - penalty).view(-1, self.num_generations)
        local = slice(self.accelerator.process_index * len(inputs), (self.accelerator.process_index + 1) * len(inputs))
        if self.kl_spec.in_advantage or self.args.advantage in kl.WHITENED:
            batch["advantages"] = self._token_advantages(batch, groups, mask)[local]
        else:
            batch["advantages"] = kl.ADVANTAGES[self.args.advantage](groups).reshape(-1)[local]
        # The training step whose policy generated this batch (for the async FIFO and its test).
        batch["policy_step"] = torch.full_like(mask[:, 0], float(self.state.global_step // self.args.updates_per_batch))
        self._metrics["train"]["task_reward"].append(task_rewards.mean().item())
        self._metrics["train"]["reward_kl_penalty"].append(penalty.mean().item())
        return batch

    def _token_advantages(self, batch, groups, mask) -> torch.Tensor:
        """Per-token advantages (global batch, this process's width) where the KL is placed in the advantage or the
        normalisation whitens over tokens: both need every process's tokens, gathered (padded to one width)."""
        to_go = torch.zeros_like(mask)
        if self.kl_spec.in_advantage:
            sampling_logps, ref = batch["old_per_token_logps"], batch["ref_per_token_logps"]
            to_go = kl.advantage_penalty(sampling_logps, ref, mask, self.kl_spec)
        width = mask.size(1)
        gathered = (self.accelerator.gather(self.accelerator.pad_across_processes(t, dim=1)) for t in (to_go, mask))
        to_go, every_mask = gathered
        shape = (*groups.shape, every_mask.size(1))
        advantages = kl.token_advantages(groups, to_go.view(shape), every_mask.view(shape), self.args.advantage)
        return advantages.reshape(-1, shape[-1])[:, :width]

    def _check_reference(self, batch: dict, mask: torch.Tensor) -> None:
        """At the first step of a run, before any update (a resumed run was checked when it began): the reference's
        log-probs of the sampled tokens against the policy's, logged as ``reference_logp_gap``; a cell whose reference
        is not its policy's starting point on some process stops here (reference.check_agreement)."""
        self._reference_checked = True
        if self.state.global_step > 0:
            return
        policy = batch.get("old_per_token_logps")
        if policy is None:
            policy = self._logps(self.model, batch)
        gap = reference.logp_gap(policy, batch["ref_per_token_logps"], mask)
        gaps = self.accelerator.gather(gap.reshape(1))
        precision = reference.forward_dtype(self.accelerator, self.accelerator.unwrap_model(self.model).dtype)
        worst = reference.check_agreement(gaps, precision)
        self._metrics["train"]["reference_logp_gap"].append(worst)

    def _needs_sampling_logps(self) -> bool:
        spec = self.kl_spec
        return spec.in_reward or spec.in_advantage or self.args.updates_per_batch > 1 or self.args.async_level > 0

    def _log_sequence_kl(self, logps, ref_logps, mask):
        """KL(π_sampling ‖ π_ref) per sequence, estimated with K1 and K3 whatever the configuration."""
        for estimator in ("k1", "k3"):
            value = kl.sequence_kl(logps.detach(), ref_logps, mask, estimator)
            self._metrics["train"][f"kl_{estimator}"].append(self.accelerator.gather(value).mean().item())

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        if self.args.async_level == 0:
            batch = self._score_batch(inputs)
        else:
            # Keep async_level batches generated ahead; at the start all come from the initial policy. The last
            # async_level steps generate nothing: those batches would be trained after the run's last step.
            while len(self._fifo) <= self.args.async_level and self._lookahead_drawn < self._generation_batches():
                self._fifo.append(self._score_batch_ahead(self._next_lookahead_prompts()))
            batch, batch_metrics = self._fifo.popleft()
            for key, values in batch_metrics.items():  # a step logs the reward and KL of the batch it trains on
                self._metrics["train"][key].extend(values)
        generated_at = int(batch["policy_step"][0].item())
        trained_at = self.state.global_step // self.args.updates_per_batch
        self.generation_log.append({"trained_step": trained_at, "policy_step": generated_at})
        self._metrics["train"]["staleness"].append(trained_at - generated_at)
        return batch

    def _score_batch_ahead(self, inputs) -> tuple[dict, dict]:
        """_score_batch for a later step: the batch, and the metrics it logged (reward, KL, length), held back."""
        metrics = self._metrics["train"]
        logged_before = {key: len(values) for key, values in metrics.items()}
        batch = self._score_batch(inputs)
        held_back = {}
        for key, values in metrics.items():
            held_back[key] = values[logged_before.get(key, 0) :]
            del values[logged_before.get(key, 0) :]
        return batch, held_back

    def _generation_batches(self) -> int:
        """Generation batches the whole run trains on: one per updates_per_batch optimiser steps (state.max_steps is
        set when training starts, also when it is given in epochs)."""
        return math.ceil(self.state.max_steps / self.args.updates_per_batch)

    def _next_lookahead_prompts(self):
        """The next generation batch of prompts, from a dataloader that runs async_level batches ahead.

        Creating a DataLoader iterator draws a seed from the global torch RNG; doing it under fork_rng keeps
        the sampling stream identical whether or not the run was resumed (when the iterator is re-created).
        """
        with torch.random.fork_rng(devices=[]):
            if self._lookahead is None:  # first call, or first after a resume
                self._lookahead = self._lookahead_iterator()
            try:
                prompts = next(self._lookahead)
            except StopIteration:  # the next epoch
                self._lookahead = self._lookahead_iterator()
                prompts = next(self._lookahead)
        self._lookahead_drawn += 1
        return prompts

    def _lookahead_iterator(self):
        """A train dataloader iterator at the look-ahead's position: that epoch's order, past what was drawn."""
        dataloader = self.get_train_dataloader()
        epoch, drawn = divmod(self._lookahead_drawn, len(dataloader))
        dataloader.set_epoch(epoch)
        iterator = iter(dataloader)
        for _ in range(drawn):
            next(iterator)
        return iterator

    def _get_train_sampler(self, dataset=None):
        return EpochSeededSampler(super()._get_train_sampler(dataset))

    # ------------------------------------------------------------------------------ held-out decoding

    @contextlib.contextmanager
    def greedy_generation(self):
        """TRL's generation made greedy while the context lasts (the held-out pass of ``heldout_decoding: greedy``):
        transformers' generation config without sampling, vLLM's temperature 0; restored afterwards."""
        saved = {name: getattr(self, name, None) for name in ("generation_config", "generation_kwargs")}
        engine = getattr(self, "vllm_generation", None)
        temperature = getattr(engine, "temperature", None)
        if saved["generation_config"] is not None:
            self.generation_config = copy.deepcopy(saved["generation_config"])
            self.generation_config.do_sample = False
        if saved["generation_kwargs"] is not None:
            self.generation_kwargs = {**saved["generation_kwargs"], "do_sample": False}
        if engine is not None:
            engine.temperature = 0.0  # vLLM: greedy
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is not None:
                    setattr(self, name, value)
            if engine is not None:
                engine.temperature = temperature

    # ------------------------------------------------------------------------------ checkpoints

    def _async_state_file(self, checkpoint) -> Path:
        """Each process's FIFO holds its own share of the batches generated ahead: one file per process."""
        return Path(checkpoint) / f"klstudy_async_state_{self.accelerator.process_index}.pt"

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.async_level:
            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            state = {"fifo": list(self._fifo), "lookahead_drawn": self._lookahead_drawn}
            torch.save(state, self._async_state_file(folder))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint and self._async_state_file(checkpoint).is_file():  # batches generated ahead survive a kill
            state = torch.load(self._async_state_file(checkpoint), weights_only=False)
            self._fifo = collections.deque(state["fifo"])
            self._lookahead_drawn = state["lookahead_drawn"]

    # ------------------------------------------------------------------------------ loss

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"]
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        old_logps = inputs.get("old_per_token_logps", logps.detach())
        ratio = torch.exp(logps - old_logps)  # ω_t = π_θ / π_old per token: 1 (with gradient) on-policy
        advantages = kl.by_token(inputs["advantages"], logps)
        per_token_loss = kl.policy_surrogate(
            self.args.policy_loss, logps, old_logps, inputs["advantages"], self.epsilon_low, self.epsilon_high
        )
        if "importance_sampling_ratio" in inputs:  # vLLM's sampling vs training mismatch, as TRL corrects it
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.kl_spec.in_loss:
            per_token_loss = per_token_loss + kl.loss_penalty(
                logps, inputs["ref_per_token_logps"], mask, self.kl_spec, old_logp=old_logps
            )
        loss = (per_token_loss * mask).sum() / self._normaliser(inputs, per_token_loss)
        self._log_loss_metrics(inputs, logps, entropies, ratio, advantages, mask)
        return loss

    def _normaliser(self, inputs, per_token_loss) -> torch.Tensor:
        """TRL 1.16's normaliser for the loss type, so that gradients match stock TRL exactly."""
        if self.loss_type == "dapo":
            tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            return tokens * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        accumulation = self.current_gradient_accumulation_steps  # dr_grpo
        return torch.tensor(per_token_loss.size(0) * self.max_completion_length * accumulation, dtype=torch.float32)

    def _log_loss_metrics(self, inputs, logps, entropies, ratio, advantages, mask):
        metrics = self._metrics["train" if self.model.training else "eval"]
        maskf = mask.float()

        def masked_mean(values):
            totals = self.accelerator.reduce(torch.stack([(values * maskf).sum(), maskf.sum()]), reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        metrics["entropy"].append(masked_mean(entropies.detach()))
        # TRL's name; the tokens the policy loss gives no gradient (clipped, truncated or masked)
        inactive = kl.inactive_tokens(self.args.policy_loss, ratio, advantages, self.epsilon_low, self.epsilon_high)
        metrics["clip_ratio/region_mean"].append(masked_mean(inactive.float()))
        if "ref_per_token_logps" in inputs and "old_per_token_logps" not in inputs:
            self._log_sequence_kl(logps, inputs["ref_per_token_logps"], maskf)  # on-policy: π_θ is the sampler
