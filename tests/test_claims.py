"""The claims table (klstudy.claims): every claim of config.yaml is called shown on results built to show it and
contradicted on results built to contradict it; results with no difference, or with the configuration labels
permuted at random, are called shown no more often than the rule's error rate; the rule and the pairing by seed
and by question compute what their docstring says."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from klstudy import claims
from klstudy.aggregate import CELL_COLUMNS, cell_columns
from klstudy.config import ConfigError, all_cells, divergence_cells, evaluated_cells, selected_betas, validate_config

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 2, 3, 4, 5]
QUESTIONS = 40
FINAL_STEP = 15

# What Table 1's exact computation gives for each configuration (as in docs/embedded/regularisation.md): the
# columns of results/toy/unbiasedness.csv that claims.expected_pull reads.
TOY_TESTS = pd.DataFrame(
    [
        dict(config="k1-reward", exact_unbiased=True, min_projection=0.2, max_projection=1.0),
        dict(config="k3-loss", exact_unbiased=False, min_projection=0.1, max_projection=0.9),
        dict(config="k1-loss", exact_unbiased=False, min_projection=0.0, max_projection=0.0),
        dict(config="k3-reward", exact_unbiased=False, min_projection=-0.3, max_projection=0.8),
        dict(config="k1-both", exact_unbiased=True, min_projection=0.2, max_projection=1.0),
        dict(config="k3-both", exact_unbiased=True, min_projection=0.2, max_projection=1.0),
    ]
)


@pytest.fixture(scope="module")
def config():
    """config.yaml with six seeds in every study and every divergence cell: enough for the rule to decide."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    for study in config["studies"].values():
        study["seeds"] = SEEDS
    config["divergence"]["seeds"] = SEEDS
    return validate_config(config)


def synthetic_tables(config: dict, level, sigma: float = 0.01, seed: int = 0) -> dict:
    """The aggregated tables of a run in which each measured value is level(metric, cell, base) plus normal noise
    of standard deviation sigma; base: the base model's measurement (a run's step 0, its evaluation)."""
    rng = np.random.default_rng(seed)
    training, heldout, evaluations, divergence = [], [], [], []
    for cell in all_cells(config):
        identity = cell_columns(cell)
        for step in range(FINAL_STEP - 4, FINAL_STEP + 1):  # the steps final_values averages (final_steps 5)
            training.append({**identity, "step": step, "kl_k3": level("final_kl", cell, False) + sigma * rng.normal()})
        for step, base in ((0, True), (FINAL_STEP, False)):
            scores = level("heldout", cell, base) + sigma * rng.normal(size=QUESTIONS)
            stderr = sigma / math.sqrt(QUESTIONS)
            heldout.append({**identity, "step": step, "pass_at_1": scores.mean(), "stderr": stderr,
                            "per_prompt": json.dumps(scores.tolist())})  # fmt: skip
    for cell in evaluated_cells(config):
        for task in config["evaluation"]["tasks"]:
            value = level("evaluation", cell, False) + sigma * rng.normal()
            evaluations.append({**cell_columns(cell), "chat_template": "on", "task": task, "mean_at_k": value,
                                "stderr": sigma})  # fmt: skip
    for model in config["studies"]["onpolicy"]["models"]:
        base = dict(study="base", model=model, kl="base", beta=0.0, seed=0, chat_template="on")
        for task in config["evaluation"]["tasks"]:
            value = level("evaluation", {**base, "study": "onpolicy"}, True) + sigma * rng.normal()
            evaluations.append({**base, "task": task, "mean_at_k": value, "stderr": sigma})
    for cell in divergence_cells(config):
        for task in config["divergence"]["tasks"]:
            for step, base in ((0, True), (FINAL_STEP, False)):
                row = {**cell_columns(cell), "task": task, "step": step}
                for metric in ("forward_kl", "entropy"):
                    row[metric] = level(metric, cell, base) + sigma * rng.normal()
                    row[f"{metric}_stderr"] = sigma
                divergence.append(row)
    return dict(
        cells=pd.DataFrame(columns=CELL_COLUMNS), training=pd.DataFrame(training), heldout=pd.DataFrame(heldout),
        evaluations=pd.DataFrame(evaluations), divergence=pd.DataFrame(divergence),
    )  # fmt: skip


def one_claim(config: dict, name: str) -> dict:
    return {**config, "claims": {name: config["claims"][name]}}


def built_for(config: dict, claim: dict, sign: float, baseline_level: float = 1.0, delta: float = 0.5):
    """level(): every measurement is baseline_level, except the claim's candidate at its β, which is
    baseline_level + sign · delta; a claim that compares a configuration with itself at another β ("falls with
    β") gets sign · delta more at each step up its study's β grid."""
    study_betas = sorted(config["studies"][claim["study"]]["betas"])
    betas = [0] if claim["candidate"] == "none" else selected_betas(claim["beta"], study_betas)
    same_study = claim.get("baseline_study", claim["study"]) == claim["study"]
    across_betas = claim["candidate"] == claim["baseline"] and same_study

    def level(metric, cell, base):
        is_configuration = cell["study"] == claim["study"] and cell["kl"] == claim["candidate"] and not base
        if across_betas:  # the configuration's own cells, one step up the β grid at a time
            return baseline_level + (sign * delta * study_betas.index(cell["beta"]) if is_configuration else 0.0)
        return baseline_level + (sign * delta if is_configuration and cell["beta"] in betas else 0.0)

    return level


def verdicts(config: dict, tables: dict) -> pd.Series:
    return claims.claims_table(config, tables, TOY_TESTS).verdict


def direction_of(config, name) -> str:
    return claims.predicted_direction(config["claims"][name], TOY_TESTS)[0]


def directional(config) -> list[str]:
    return [name for name in config["claims"] if direction_of(config, name) in ("higher", "lower")]


def test_every_directional_claim_is_shown_when_built_to_show_and_contradicted_when_built_to_contradict(config):
    names = directional(config)
    assert len(names) >= 12, names
    for name in names:
        claim, predicted = config["claims"][name], direction_of(config, name)
        sign = 1.0 if predicted == "higher" else -1.0
        single = one_claim(config, name)
        shown = verdicts(single, synthetic_tables(single, built_for(config, claim, sign)))
        contradicted = verdicts(single, synthetic_tables(single, built_for(config, claim, -sign)))
        assert set(shown) == {"shown"}, (name, list(shown))
        assert set(contradicted) == {"contradicted"}, (name, list(contradicted))


def test_a_claim_of_no_difference_is_shown_inside_its_margin_and_contradicted_far_outside(config):
    name = "k1_loss_does_not_regularise"
    assert direction_of(config, name) == "same"
    single = one_claim(config, name)
    claim = config["claims"][name]
    assert set(verdicts(single, synthetic_tables(single, built_for(config, claim, 0.0)))) == {"shown"}
    assert set(verdicts(single, synthetic_tables(single, built_for(config, claim, 1.0, delta=2.0)))) == {"contradicted"}
    # Inside the margin (0.5 of a baseline of 1), but by fewer than critical standard errors: not shown; outside it,
    # but not by critical standard errors: not shown either.
    rule = config["claims_rule"]
    assert claims.verdict(0.45, 0.05, 5, "same", 1.0, rule, margin=0.5)[2] == "not shown"
    assert claims.verdict(-0.6, 0.05, 5, "same", 1.0, rule, margin=0.5)[2] == "not shown"
    assert claims.verdict(-0.8, 0.05, 5, "same", 1.0, rule, margin=0.5)[2] == "contradicted"


def test_results_with_no_difference_are_shown_no_more_often_than_the_rules_error_rate(config):
    """Every measurement the same in distribution (level 1, noise 0.1): each directional claim row is a test of a
    true null; over 20 such runs the fraction called shown is within binomial noise of at most alpha."""
    names = directional(config)
    selected = {**config, "claims": {name: config["claims"][name] for name in names}}
    table = pd.concat(
        claims.claims_table(selected, synthetic_tables(selected, lambda *_: 1.0, sigma=0.1, seed=s), TOY_TESTS)
        for s in range(20)
    )
    alpha, rows = config["claims_rule"]["alpha"], len(table)
    shown = (table.verdict == "shown").sum()
    assert rows >= 400
    assert shown <= alpha * rows + 3 * math.sqrt(alpha * rows), (shown, rows)


def test_with_the_configuration_labels_permuted_nothing_is_shown_beyond_the_error_rate(config):
    """A run in which every configuration and β differs (a level of its own, up to 10 noise standard deviations
    apart), so that most claims are shown or contradicted; then the same run with each seed's configuration labels
    permuted at random within its study. Claims against the base model are left out: a permutation of the trained
    configurations does not touch what they compare."""
    names = [name for name in directional(config) if config["claims"][name]["baseline"] != "base"]
    selected = {**config, "claims": {name: config["claims"][name] for name in names}}
    rng = np.random.default_rng(1)
    levels = {}

    def level_of(metric, cell):
        key = (metric, cell["study"], cell["kl"], float(cell["beta"]))
        return levels.setdefault(key, rng.uniform(0, 1))

    def honest(metric, cell, base):
        return 0.5 if base else level_of(metric, cell)

    truth = claims.claims_table(selected, synthetic_tables(selected, honest, sigma=0.1), TOY_TESTS)
    assert (truth.verdict != "not shown").mean() > 0.5, truth.verdict.value_counts()

    cells_by_study = {}
    for cell in all_cells(config):
        cells_by_study.setdefault((cell["study"], cell["seed"]), []).append((cell["kl"], float(cell["beta"])))
    verdict_rows = []
    for permutation in range(12):
        relabel = {}
        for (study, seed), labels in cells_by_study.items():
            shuffled = [labels[i] for i in rng.permutation(len(labels))]
            relabel.update({(study, seed, *label): other for label, other in zip(labels, shuffled, strict=True)})

        def permuted(metric, cell, base, relabel=relabel):
            if base:
                return 0.5
            kl_config, beta = relabel[(cell["study"], cell["seed"], cell["kl"], float(cell["beta"]))]
            return level_of(metric, {**cell, "kl": kl_config, "beta": beta})

        tables = synthetic_tables(selected, permuted, sigma=0.1, seed=permutation)
        verdict_rows.append(claims.claims_table(selected, tables, TOY_TESTS))
    table = pd.concat(verdict_rows)
    alpha, rows = config["claims_rule"]["alpha"], len(table)
    shown = (table.verdict == "shown").sum()
    assert shown <= alpha * rows + 3 * math.sqrt(alpha * rows), (shown, rows)


def test_the_rule_asks_for_more_standard_errors_where_few_units_make_the_error_uncertain():
    rule = {"alpha": 0.01, "min_z": 3}
    z, critical, word = claims.verdict(-1.0, 0.1, 1, "lower", 2.0, rule)  # two seeds: t(0.99, 1) = 31.8
    assert z == pytest.approx(10) and critical == pytest.approx(31.82, abs=0.01) and word == "not shown"
    z, critical, word = claims.verdict(-1.0, 0.1, 39, "lower", 2.0, rule)  # forty questions: t ≈ 2.43 < 3
    assert critical == 3 and word == "shown"
    assert claims.verdict(1.0, 0.1, 39, "lower", 2.0, rule)[2] == "contradicted"
    assert claims.verdict(1.0, float("nan"), 0, "lower", 2.0, rule)[2] == "not shown"
    assert claims.verdict(1.0, 0.1, 39, None, 2.0, rule)[2] == "no prediction"


def test_pairing_by_question_uses_each_questions_difference_averaged_over_seeds():
    """Two seeds, four questions: d_q = mean over seeds of (candidate − base) for question q."""
    candidate = pd.DataFrame({"value": [0.5, 0.75], "se": [0.1, 0.1],
                              "per_question": [[1, 0, 1, 0], [1, 1, 1, 0]]}, index=[0, 1])  # fmt: skip
    base = pd.DataFrame({"value": [0.25, 0.25], "se": [0.1, 0.1],
                         "per_question": [[0, 0, 1, 0], [1, 0, 0, 0]]}, index=[0, 1])  # fmt: skip
    d, se, df, units, seeds, note = claims._paired(candidate, base, "questions")
    assert list(d) == [0.5, 0.5, 0.5, 0.0] and df == 3 and units == 4 and seeds == 2 and not note
    assert se == pytest.approx(np.std([0.5, 0.5, 0.5, 0.0], ddof=1) / 2)
    by_seed = claims._paired(candidate, base, "seeds")
    assert list(by_seed[0]) == [0.25, 0.5] and by_seed[2] == 1
    one_seed = claims._paired(candidate.loc[[0]], base.loc[[0]], "seeds")
    assert one_seed[1] == pytest.approx(math.sqrt(0.02)) and one_seed[2] == math.inf and "one seed" in one_seed[5]


def test_table1_predictions_follow_the_exact_computation():
    claim = {"predicted": "table1", "candidate": "k1-reward"}
    assert claims.predicted_direction(claim, TOY_TESTS)[0] == "lower"
    assert claims.predicted_direction({**claim, "candidate": "k3-loss"}, TOY_TESTS)[0] == "lower"
    assert claims.predicted_direction({**claim, "candidate": "k1-loss"}, TOY_TESTS)[0] == "same"
    assert claims.predicted_direction({**claim, "candidate": "k3-reward"}, TOY_TESTS)[0] is None
    assert claims.predicted_direction({**claim, "candidate": "k2-reward"}, TOY_TESTS) == (
        None,
        "Table 1 exact: not analysed",
    )


def test_missing_runs_give_rows_that_say_so(config):
    single = one_claim(config, "k1_reward_regularises")
    tables = synthetic_tables(single, lambda *_: 1.0)
    tables["training"] = tables["training"][tables["training"].kl != "none"]
    table = claims.claims_table(single, tables, TOY_TESTS)
    assert set(table.verdict) == {"not shown"} and set(table.note) == {"no paired runs"} and (table.seeds == 0).all()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"candidate": "k2-reward"}, "claims.c.kl"),
        ({"baseline": "k2-loss"}, "claims.c.baseline.kl"),
        ({"metric": "final_kl", "baseline": "base"}, "claims.c.baseline': base is the base model"),
        ({"predicted": "same"}, "claims.c.margin"),
        ({"predicted": "table1"}, "claims.c.predicted"),
        ({"pair_by": "questions", "metric": "final_kl"}, "claims.c.pair_by"),
        ({"metric": "evaluation", "candidate": "k1-loss"}, "claims.c.metric': evaluation: k1-loss"),
        ({"metric": "forward_kl", "candidate": "k3-reward"}, "claims.c.metric': forward_kl: k3-reward"),
        ({"beta": 0.3}, "claims.c.beta"),
        ({"beta": "min", "baseline_beta": "below"}, "claims.c.baseline_beta"),
        ({"text": 3}, "claims.c.text"),
    ],
)
def test_a_claim_that_names_what_the_grid_does_not_measure_is_refused_naming_the_key(change, message):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["claims"] = {"c": {**config["claims"]["k1_loss_below_k1_reward"], **change}}
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        validate_config(config)


def test_every_config_claims_table_is_built_by_the_same_code():
    """config/paper.yaml and config/smollm2.yaml list claims, and the claims of each are valid there."""
    for path in ("config/paper.yaml", "config/smollm2.yaml"):
        config = validate_config(yaml.safe_load((ROOT / path).read_text()))
        assert len(config["claims"]) >= 8, path
        table = claims.claims_table(config, synthetic_tables(config, lambda *_: 1.0), TOY_TESTS)
        assert len(table) >= len(config["claims"]) and set(table.claim) == set(config["claims"])


def test_seeds_that_agree_by_chance_do_not_make_the_error_zero():
    """Two seeds whose differences are equal (held-out scores are multiples of 1/questions): the spread over seeds is
    0, and the error is the measurement's own, so one question's difference is not 'shown'."""
    candidate = pd.DataFrame({"value": [0.34, 0.35], "se": [0.05, 0.05]}, index=[0, 1])
    baseline = pd.DataFrame({"value": [0.35, 0.36], "se": [0.05, 0.05]}, index=[0, 1])
    d, se, df, *_, note = claims._paired(candidate, baseline, "seeds")
    assert se == pytest.approx(math.sqrt(4 * 0.05**2) / 2) and df == 1 and "own error" in note
    assert claims.verdict(d.mean(), se, df, "lower", 0.355, {"alpha": 0.01, "min_z": 3})[2] == "not shown"
    # One seed of final_kl: its steps' spread says nothing of another seed.
    one = claims._paired(candidate.loc[[0]], baseline.loc[[0]], "seeds", over_steps=True)
    assert math.isnan(one[1]) and "no error over seeds" in one[5]


def test_an_unknown_measurement_error_is_no_floor_at_all():
    """A run whose own error is unknown (NaN) leaves the floor unknown, not smaller: two seeds fall back to their
    spread, and one seed has no error to judge by."""
    candidate = pd.DataFrame({"value": [0.30, 0.40], "se": [math.nan, 0.5]}, index=[0, 1])
    baseline = pd.DataFrame({"value": [0.20, 0.20], "se": [0.5, 0.5]}, index=[0, 1])
    d, se, df, *_, note = claims._paired(candidate, baseline, "seeds")
    assert se == pytest.approx(d.std(ddof=1) / math.sqrt(2)) and note == ""
    one = claims._paired(candidate.loc[[0]], baseline.loc[[0]], "seeds")
    assert math.isnan(one[1]) and "no error over seeds" in one[5]


def test_below_compares_each_beta_with_the_next_smaller_one(config):
    """`beta: each, baseline_beta: below`: one row per step of the β grid, each judged on its own step: a KL that
    falls from the smallest β to the next and rises after is shown on the first step and contradicted on the next."""
    betas = [0.1, 1.0, 10.0, 30.0]
    claim = dict(config["claims"]["k1_reward_falls_with_beta"], beta="each", baseline_beta="below")
    studies = {**config["studies"], "onpolicy": {**config["studies"]["onpolicy"], "betas": betas}}
    single = {**config, "studies": studies, "claims": {"falls": claim}}
    kl_at = {betas[0]: 1.0, betas[1]: 0.5, **{beta: 1.5 for beta in betas[2:]}}

    def level(metric, cell, base):
        return kl_at.get(cell["beta"], 1.0) if cell["kl"] == "k1-reward" else 1.0

    table = claims.claims_table(single, synthetic_tables(single, level), TOY_TESTS)
    assert list(table.beta) == betas[1:] and list(table.baseline_beta) == betas[:-1]
    assert list(table.verdict) == ["shown", "contradicted"] + ["not shown"] * (len(betas) - 3)


@pytest.mark.parametrize(("kl_of_beta", "expected"), [
    (lambda beta: 1.0 - 0.2 * math.log10(beta), "shown"),  # falls steadily as β grows
    (lambda beta: 1.0 + 0.2 * math.log10(beta), "contradicted"),  # rises
    (lambda beta: 1.0, "not shown"),  # flat: only noise
])  # fmt: skip
def test_trend_tests_the_slope_over_the_whole_beta_grid(config, kl_of_beta, expected):
    """`beta: trend`: one row per model, each seed's slope of the KL over log10 β across the study's grid, tested
    against zero; its candidate_mean and baseline_mean are the KL at the largest and smallest β."""
    betas = [0.1, 0.3, 1.0, 10.0]
    claim = dict(config["claims"]["k1_reward_falls_with_beta"], beta="trend", baseline_beta="same")
    studies = {**config["studies"], "onpolicy": {**config["studies"]["onpolicy"], "betas": betas}}
    single = validate_config({**config, "studies": studies, "claims": {"trend": claim}})

    def level(metric, cell, base):
        return kl_of_beta(cell["beta"]) if cell["kl"] == "k1-reward" else 1.0

    (row,) = claims.claims_table(single, synthetic_tables(single, level), TOY_TESTS).to_dict("records")
    assert row["verdict"] == expected and row["units"] == len(SEEDS) and row["runs"] == len(SEEDS) * len(betas)
    assert (row["beta"], row["baseline_beta"]) == (10.0, 0.1) and "0.1, 0.3, 1, 10" in row["note"]
    assert row["candidate_mean"] == pytest.approx(kl_of_beta(10.0), abs=0.02)
    assert row["baseline_mean"] == pytest.approx(kl_of_beta(0.1), abs=0.02)
    if expected != "not shown":
        assert row["effect"] == pytest.approx(-0.2 if expected == "shown" else 0.2, abs=0.01)  # per decade of β


@pytest.mark.parametrize(
    "change", [{}, {"baseline": "none"}, {"baseline_beta": "below"}, {"candidate": "none", "baseline": "none"}]
)
def test_trend_needs_three_betas_and_the_candidate_as_its_own_baseline(config, change):
    """config.yaml's on-policy grid has two β: a trend over it is one step (baseline_beta below says that); a trend
    against another configuration, or of no KL (one run at β = 0), is not a trend; each is refused naming the key."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    claim = {**raw["claims"]["k1_reward_falls_with_beta"], "beta": "trend", "baseline_beta": "same", **change}
    if change:  # three β, so that only the changed key is wrong
        raw["studies"]["onpolicy"]["betas"] = [0.1, 1.0, 10.0]
    raw["claims"] = {"c": claim}
    with pytest.raises(ConfigError, match=r"claims\.c\.beta': trend"):
        validate_config(raw)


def test_the_caption_names_the_base_models_the_runs_started_from(config):
    """Two machines can build different embedded base models (docs/claims.md): the caption says which one each run
    started from, and says so when one model's runs started from different weights. The table carries it in a column
    too: the report shows the CSV, whose caption is rendered from the config alone."""
    one = pd.DataFrame({"model": ["tiny", "tiny", "tiny"], "base_model_sha256": ["1a" * 32, "1a" * 32, None]})
    text = claims.caption(config, one)
    assert "tiny 1a1a1a1a1a1a." in text and "mix experiments" not in text
    mixed = pd.DataFrame({"model": ["tiny", "tiny"], "base_model_sha256": ["1a" * 32, "2b" * 32]})
    assert "tiny 1a1a1a1a1a1a, 2b2b2b2b2b2b" in claims.caption(config, mixed)
    assert "mix experiments" in claims.caption(config, mixed)
    assert "Base models" not in claims.caption(config, pd.DataFrame({"model": ["tiny"]}))  # runs before digests
    assert "Base models" not in claims.caption(config)
    single = one_claim(config, "k1_reward_regularises")
    tables = synthetic_tables(single, lambda *_: 1.0)
    model = single["studies"]["onpolicy"]["models"][0]
    tables["cells"] = pd.DataFrame({"model": [model, model], "base_model_sha256": ["1a" * 32, "2b" * 32]})
    table = claims.claims_table(single, tables, TOY_TESTS)
    assert len(table) and set(table.base_model) == {"1a1a1a1a1a1a, 2b2b2b2b2b2b"}
    assert set(claims.claims_table(single, synthetic_tables(single, lambda *_: 1.0), TOY_TESTS).base_model) == {""}
