"""Speed of the Figure 1 protocol: the whole of it, and vectorised vs a per-sequence loop, side by side.

    .venv/bin/python benchmarks/toy_protocol.py [--config config.yaml] [--threads 2]

Prints (1) the wall time of the full protocol of the config (every setting × T × configuration, 200
trials × 1000 sequences in the default config; target < 10 s on 2 cores) and (2) on a subset (one
setting, the longest T, a few hundred sequences), the time per sequence of the vectorised code and of a
straightforward loop that differentiates each sequence's loss on its own, their ratio, and what the
loop would take for the full protocol. Both paths compute the same estimates; the script checks that.
"""

import argparse
import time

import numpy as np
import torch
import yaml

from klstudy import kl
from klstudy.analysis import toy


def full_protocol(config) -> float:
    start = time.perf_counter()
    for name, params in config["settings"].items():
        toy.bias_variance(
            toy.ToySetting(name, **params),
            config["lengths"],
            config["estimators"],
            config["placements"],
            config["trials"],
            config["sequences"],
            config["seed"],
            config["baseline"],
        )
    return time.perf_counter() - start


def loop_estimates(setting, y, specs):
    """One trial's mean gradient per configuration, one sequence at a time (the naive way)."""
    sums = {spec.name: np.zeros(2) for spec in specs}
    for sequence in y:
        counts = toy.counts_before(sequence)
        for spec in specs:
            a = torch.tensor(setting.a, dtype=toy.DTYPE, requires_grad=True)
            b = torch.tensor(setting.b, dtype=toy.DTYPE, requires_grad=True)
            logp = toy.token_logprobs(a, b, sequence, counts)
            ref_logp = toy.token_logprobs(setting.a_ref, setting.b_ref, sequence, counts)
            loss = kl.reinforce_loss(
                logp[None],
                ref_logp[None],
                torch.ones(1, len(sequence), dtype=toy.DTYPE),
                torch.zeros(1, dtype=toy.DTYPE),
                spec,
                "none",
            )
            grads = torch.autograd.grad(loss, (a, b), allow_unused=True)
            sums[spec.name] += [0.0 if g is None else g.item() for g in grads]
    return {name: total / len(y) for name, total in sums.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--subset-sequences", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with open(args.config) as handle:
        config = yaml.safe_load(handle)["toy"]
    config.setdefault("baseline", "none")

    specs = toy.config_specs(config["estimators"], config["placements"])
    name, params = next(iter(config["settings"].items()))
    setting, length = toy.ToySetting(name, **params), max(config["lengths"])
    y = toy.sample_sequences(setting.a, setting.b, length, (1, args.subset_sequences), torch.Generator().manual_seed(0))

    start = time.perf_counter()
    vectorised = toy.estimates_from_samples(setting, y, specs)
    vectorised_time = time.perf_counter() - start
    start = time.perf_counter()
    looped = loop_estimates(setting, y[0], specs)
    loop_time = time.perf_counter() - start
    for spec in specs:
        assert np.allclose(vectorised[spec.name][0], looped[spec.name], rtol=1e-9, atol=1e-12), spec.name

    total_sequences = len(config["settings"]) * config["trials"] * config["sequences"]
    protocol_time = full_protocol(config)
    n = args.subset_sequences
    print(f"threads: {torch.get_num_threads()}")
    print(
        f"full protocol: {len(config['settings'])} settings x T in {config['lengths']} x {len(specs)} configurations, "
        f"{config['trials']} trials x {config['sequences']} sequences: {protocol_time:.2f} s (target < 10 s)"
    )
    print(f"subset ({name}, T={length}, {n} sequences, {len(specs)} configurations):")
    print(f"  vectorised:         {1e6 * vectorised_time / n:9.1f} us per sequence")
    print(f"  per-sequence loop:  {1e6 * loop_time / n:9.1f} us per sequence")
    print(f"  loop / vectorised:  {loop_time / vectorised_time:9.1f}x")
    print(
        f"  the loop would need about {loop_time / n * total_sequences * len(config['lengths']) / 60:.0f} min "
        f"for the full protocol (at T={length} for every length: an upper bound)"
    )


if __name__ == "__main__":
    main()
