"""Fixtures shared across test modules."""

import pytest
import torch
from workflow_helpers import reduced_run  # noqa: F401  (the reduced study, run once per session)

from klstudy.data import procedural, staging
from klstudy.train import tiny

# One torch thread in the test process, as the workflow gives every toy job (--threads 1): the toy's tensors are tiny,
# and two threads' hand-offs per operation made its exact computations 5 times slower on a loaded 2-core machine (the
# tests that train start processes of their own, with their own threads).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """An untrained tiny model: cheap, and far from deterministic, so completions differ within a group."""
    spec = tiny.TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128, sft_steps=0)
    tokenizer = tiny.build_tokenizer()
    path = tmp_path_factory.mktemp("model")
    tiny.save(tiny.build_model(spec, tokenizer), tokenizer, path, spec, {})
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("data")
    staging.write_jsonl(procedural.arithmetic("t", 16, 0, ["add1"], "train"), path / "train.jsonl")
    staging.write_jsonl(procedural.arithmetic("h", 6, 0, ["add1"], "heldout"), path / "heldout.jsonl")
    return path
