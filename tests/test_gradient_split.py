"""One optimiser step does not depend on how its minibatch is split.

The same 16 completions (4 prompts × 4 rollouts, tokens fixed by (prompt, rollout): tests/gradient_split.py) train one
step of KLTrainer whole (1 process × 1 micro-batch), in 4 micro-batches, over two processes (DDP over gloo, through
`accelerate launch` as a cell runs) and over two processes of 2 micro-batches each. The gradient the optimiser gets
must be the same: the token-sum (dapo) normaliser counts the tokens of the whole generation batch on every process,
Dr. GRPO's counts completions × the maximum length, gradient accumulation sums micro-batches and DDP averages
processes (trainer.KLTrainer._normaliser). The KL enters through the advantages (reward: the penalty is gathered
before the leave-one-out baseline), the loss or both, so each placement is checked.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from workflow_helpers import ROOT

sys.path.insert(0, str(Path(__file__).parent))
from gradient_split import KL_CONFIGS, LOSS_TYPES  # noqa: E402

pytestmark = pytest.mark.multiprocess  # the several-processes tier: `make test-multiprocess` (docs/testing.md)

SPLITS = ("1x4", "2x1", "2x2")  # processes x micro-batches per process, against 1x1


def _run(command: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRL_EXPERIMENTAL_SILENCE": "1"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]


@pytest.fixture(scope="module")
def gradients(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gradients")
    script = str(ROOT / "tests" / "gradient_split.py")
    _run([sys.executable, script, str(model_dir), str(out), "1", "4"])
    accelerate = str(Path(sys.executable).parent / "accelerate")
    _run([accelerate, "launch", "--config_file", str(ROOT / "config/accelerate/cpu-2proc.yaml"), script,
          str(model_dir), str(out), "1", "2"])  # fmt: skip
    return lambda loss_type, kl_config, split: torch.load(out / f"{loss_type}_{kl_config}_{split}.pt")


@pytest.mark.parametrize("kl_config", KL_CONFIGS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_one_step_has_the_same_gradient_however_the_minibatch_is_split(gradients, loss_type, kl_config):
    whole = gradients(loss_type, kl_config, "1x1")
    assert whole.norm() > 0
    for split in SPLITS:
        torch.testing.assert_close(gradients(loss_type, kl_config, split), whole, rtol=1e-4, atol=1e-7, msg=split)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_the_comparison_sees_the_kl_and_the_normalisation(gradients, loss_type):
    """The gradients compared above differ between KL configurations and between normalisations by much more than
    the tolerance: a split that lost the KL term, or normalised like the other loss type, would fail."""
    none = gradients(loss_type, "none", "1x1")
    for kl_config in KL_CONFIGS[1:]:
        assert not torch.allclose(gradients(loss_type, kl_config, "1x1"), none, rtol=1e-3, atol=1e-6), kl_config
    other = gradients(next(t for t in LOSS_TYPES if t != loss_type), "none", "1x1")
    assert not torch.allclose(other, none, rtol=1e-3, atol=1e-6)
