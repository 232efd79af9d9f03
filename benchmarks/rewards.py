"""Time per reward call on adversarial completions against ordinary ones, for every reward kind.

    .venv/bin/python benchmarks/rewards.py [--count 2000] [--seed 0]

Model outputs are untrusted text: a completion built to stall a parser (deep nesting, towers of powers,
200 000 characters) must not stall training: no call may take much longer than the math verifier's
timeout (rewards.MATH_TIMEOUT_SECONDS, after which its worker is killed and the answer scores 0).
The adversarial completions are the fuzz tests' (tests/test_rewards.py); the ordinary ones are short correct
and wrong answers in each reward's format. Calls of the two kinds alternate, so machine load affects both
alike. The script prints, per reward, the median and slowest call of each kind and their ratio, and how
many math calls hit the timeout. Target: slowest adversarial call <= 2 × the timeout. (Measured on 2 cores,
600 completions: math 3.3 vs 0.55 ms median, slowest 510 ms, 23 timeouts; multiple choice 0.18 vs 0.04 ms, slowest
1.4 ms; countdown faster on adversarial text than on ordinary.)
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_rewards import FUZZ_RECORDS, adversarial_completions  # noqa: E402

from klstudy.data import rewards  # noqa: E402

ORDINARY = {
    "math": ["So the total is 3. The answer is \\boxed{3}.", "I think it is \\boxed{\\frac{1}{2}}."],
    "multiple_choice": ["Comparing them, the answer is (B).", "\\boxed{C}"],
    "countdown": ["<answer>1 + 2 + 3</answer>", "<answer>(3 - 1) * 2</answer>"],
}


def seconds(record: dict, completion: str) -> float:
    start = time.perf_counter()
    rewards.score(record, completion)
    return time.perf_counter() - start


def summary(calls: list[float]) -> str:
    return f"{statistics.median(calls) * 1e3:.3f} (max {max(calls) * 1e3:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="adversarial completions (each reward gets a third)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rewards.MATH_VERIFIER.warm_up()
    times = {record["reward"]: {"ordinary": [], "adversarial": []} for record in FUZZ_RECORDS}
    for i, completion in enumerate(adversarial_completions(args.count, seed=args.seed)):
        record = FUZZ_RECORDS[i % len(FUZZ_RECORDS)]
        kind = times[record["reward"]]
        kind["ordinary"].append(seconds(record, ORDINARY[record["reward"]][i % 2]))
        kind["adversarial"].append(seconds(record, completion))

    print(f"math timeout {rewards.MATH_TIMEOUT_SECONDS} s; calls cut off by it: {rewards.MATH_VERIFIER.timeouts}")
    print(f"{'reward':16} {'calls':>6} {'ordinary ms':>24} {'adversarial ms':>24} {'median ratio':>13}")
    for name, kind in times.items():
        ordinary, adversarial = (summary(kind[k]) for k in ("ordinary", "adversarial"))
        ratio = statistics.median(kind["adversarial"]) / statistics.median(kind["ordinary"])
        print(f"{name:16} {len(kind['adversarial']):6d} {ordinary:>24} {adversarial:>24} {ratio:13.2f}")


if __name__ == "__main__":
    main()
