"""The claims table (klstudy.report.claims): every claim of config.yaml is called shown on results built to show it and
contradicted on results built to contradict it; results with no difference (seeds apart, runs stopped early or
non-finite), or with the configuration labels permuted at random, are called shown no more often than the rule's
error rate; one seed is never judged; a run that did not finish whole moves or leaves its comparison, and the row says
so; the pairings by seed, by question and against one evaluation of the base model compute what their docstring says.
The calibration of each path on many simulated rows is in test_claims_calibration.py."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import binom

from klstudy import claims_rule
from klstudy.config import ConfigError, all_cells, divergence_cells, evaluated_cells, selected_betas, validate_config
from klstudy.report import aggregate, claims
from klstudy.report.aggregate import cell_columns
from klstudy.report.claims import METRICS

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


def synthetic_tables(
    config: dict, level, sigma: float = 0.01, seed: int = 0, seed_sd: float = 0.0, stopped: dict | None = None
) -> dict:
    """The aggregated tables of a run in which each measured value is level(metric, cell, base) plus a run's own
    offset (normal, standard deviation seed_sd: what another training seed changes) plus normal noise of standard
    deviation sigma; base: the base model's measurement (a run's step 0, its evaluation). Each run logs the K3 at
    every step and held-out pass@1 every 5 steps up to its study's planned steps, cells.csv says ok; ``stopped``:
    (study, kl, beta, seed) -> (status, last step) for runs that stopped early (their rows end there)."""
    rng = np.random.default_rng(seed)
    stopped = stopped or {}
    training, heldout, evaluations, divergence, cells = [], [], [], [], []
    for cell in all_cells(config):
        identity = cell_columns(cell)
        planned = config["studies"][cell["study"]]["train"]["steps"]
        status, end = stopped.get((cell["study"], cell["kl"], float(cell["beta"]), cell["seed"]), ("ok", planned))
        cells.append({**identity, "status": status, "steps_done": end, "steps_planned": planned})
        offset = {metric: seed_sd * rng.normal() for metric in METRICS}
        for step in range(1, end + 1):
            value = level("final_kl", cell, False) + offset["final_kl"] + sigma * rng.normal()
            training.append({**identity, "step": step, "kl_k3": value})
        for step in range(0, end + 1, 5):
            base = step == 0
            shift = level("heldout", cell, base) + (0 if base else offset["heldout"])
            scores = shift + sigma * rng.normal(size=QUESTIONS)
            heldout.append({**identity, "step": step, "pass_at_1": scores.mean(), "stderr": sigma / QUESTIONS**0.5,
                            "per_prompt": json.dumps(list(scores))})  # fmt: skip
    for cell in evaluated_cells(config):
        offset = seed_sd * rng.normal()
        for task in config["evaluation"]["tasks"]:
            value = level("evaluation", cell, False) + offset + sigma * rng.normal()
            evaluations.append({**cell_columns(cell), "chat_template": "on", "task": task, "mean_at_k": value,
                                "stderr": sigma})  # fmt: skip
    for model in config["studies"]["onpolicy"]["models"]:
        base = dict(study="base", model=model, kl="base", beta=0.0, seed=0, chat_template="on")
        for task in config["evaluation"]["tasks"]:
            value = level("evaluation", {**base, "study": "onpolicy"}, True) + sigma * rng.normal()
            evaluations.append({**base, "task": task, "mean_at_k": value, "stderr": sigma})
    for cell in divergence_cells(config):
        offset = {metric: seed_sd * rng.normal() for metric in ("forward_kl", "entropy")}
        for task in config["divergence"]["tasks"]:
            for step, base in ((0, True), (FINAL_STEP, False)):
                row = {**cell_columns(cell), "task": task, "step": step}
                for metric in ("forward_kl", "entropy"):
                    row[metric] = level(metric, cell, base) + (0 if base else offset[metric]) + sigma * rng.normal()
                    row[f"{metric}_stderr"] = sigma
                divergence.append(row)
    return dict(
        cells=pd.DataFrame(cells), training=pd.DataFrame(training), heldout=pd.DataFrame(heldout),
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
    judged = claims_rule.judge([0.45, -0.6, -0.8], [0.05] * 3, [5] * 3, ["same"] * 3, [0.5] * 3, config["claims_rule"])
    assert list(judged["verdict"]) == ["not shown", "not shown", "contradicted"]


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
@pytest.mark.parametrize("six_seeds", [True, False])
def test_results_with_no_difference_are_shown_no_more_often_than_the_rules_error_rate(config, six_seeds):
    """Every measurement the same in distribution (level 1, noise 0.1), the seeds apart by twice that, a collapsed and
    a diverged run in each grid (stopped at step 8 and 12); six seeds everywhere, or config.yaml's own (one or two):
    each directional claim row is a test of a true null; over 8 such runs the rows called shown stay within a
    binomial bound of alpha (the rule before showed 31 of 232 at config.yaml's seeds), every row that a stopped run
    touches says so, and none is judged on one seed."""
    if not six_seeds:
        config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    names = directional(config)
    selected = {**config, "claims": {name: config["claims"][name] for name in names}}
    stopped = {("onpolicy", "k1-reward", 1.0, 1): ("collapsed", 8), ("onpolicy", "none", 0.0, 0): ("diverged", 12)}
    table = pd.concat(
        claims.claims_table(
            selected,
            synthetic_tables(selected, lambda *_: 1.0, sigma=0.1, seed=s, seed_sd=0.2, stopped=stopped),
            TOY_TESTS,
        )
        for s in range(8)
    )
    alpha, rows = config["claims_rule"]["alpha"], len(table)
    assert rows >= 200
    assert (table.verdict == "shown").sum() <= binom.ppf(1 - 1e-4, rows, alpha), table.verdict.value_counts()
    touched = table[(table.study == "onpolicy") & table.metric.isin(["final_kl", "heldout"])
                    & ((table.candidate == "none") | (table.baseline == "none"))]  # fmt: skip
    assert len(touched) and touched.note.str.contains("none seed 0 diverged at step 12").all()
    assert not table[table.seeds < 2].verdict.isin(["shown", "contradicted"]).any()


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
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
    rule = {"alpha": 0.01, "min_z": 3, "q": 0.05, "fdr": "bh"}
    assert claims_rule.critical_value([1, 3, 39], rule) == pytest.approx([31.82, 4.54, 3.0], abs=0.01)
    judged = claims_rule.judge([-1.0, -1.0, 1.0, 1.0, 1.0], [0.1, 0.1, 0.1, math.nan, 0.1], [1, 39, 39, 0, 39],
                          ["lower", "lower", "lower", "lower", None], [math.nan] * 5, rule)  # fmt: skip
    assert judged["z"][0] == pytest.approx(10) and judged["critical"][0] == pytest.approx(31.82, abs=0.01)
    assert list(judged["verdict"]) == ["not shown", "shown", "contradicted", "not shown", "not shown"]
    assert np.isnan(judged["z"][3]) and np.isnan(judged["z"][4])


def test_pairing_by_question_uses_seeds_and_questions_both():
    """Two seeds, four questions: d_sq = candidate − base for seed s and question q; the error over seeds (row
    means, never below the residual's share) plus the error over questions (column means): two levels."""
    candidate = pd.DataFrame({"value": [0.5, 0.75], "se": [0.1, 0.1],
                              "per_question": [[1, 0, 1, 0], [1, 1, 1, 0]]}, index=[0, 1])  # fmt: skip
    base = pd.DataFrame({"value": [0.25, 0.25], "se": [0.1, 0.1],
                         "per_question": [[0, 0, 1, 0], [1, 0, 0, 0]]}, index=[0, 1])  # fmt: skip
    test = claims_rule.paired_test(candidate, base, "questions")
    d = np.array([[1, 0, 0, 0], [0, 1, 1, 0]], dtype=float)
    rows, columns = d.mean(axis=1), d.mean(axis=0)
    residual = d - rows[:, None] - columns[None, :] + d.mean()
    ms_residual = (residual**2).sum() / (1 * 3)
    expected = math.sqrt(max(rows.var(ddof=1), ms_residual / 4) / 2 + columns.var(ddof=1) / 4)
    assert test["effect"] == pytest.approx(0.375) and test["se"] == pytest.approx(expected)
    assert (test["df"], test["units"], test["seeds"], test["why"]) == (1, 4, 2, None)
    by_seed = claims_rule.paired_test(candidate, base, "seeds")
    assert by_seed["effect"] == pytest.approx(0.375) and by_seed["df"] == 1
    assert claims_rule.paired_test(candidate.loc[[0]], base.loc[[0]], "questions")["why"] == "one seed"
    assert claims_rule.paired_test(candidate.loc[[0]], base.loc[[0]], "seeds")["why"] == "one seed"


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


def test_a_projection_of_zero_somewhere_and_a_pull_elsewhere_is_no_push():
    """min projection 0 (no pull in some setting) and max > 0 (a pull in another): the expected gradient never
    opposes the KL's, so Table 1 predicts a lower KL, not "may push away"."""
    tests = pd.DataFrame([dict(config="k2-loss", exact_unbiased=False, min_projection=0.0, max_projection=0.6)])
    pull = claims.expected_pull(tests, "k2-loss")
    assert "push" not in pull and pull.startswith("pulls towards π_ref in some settings")
    assert claims.predicted_direction({"predicted": "table1", "candidate": "k2-loss"}, tests)[0] == "lower"


def test_missing_runs_give_rows_that_say_so(config):
    single = one_claim(config, "k1_reward_regularises")
    tables = synthetic_tables(single, lambda *_: 1.0)
    tables["training"] = tables["training"][tables["training"].kl != "none"]
    table = claims.claims_table(single, tables, TOY_TESTS)
    assert set(table.verdict) == {"not testable: no paired runs"} and (table.seeds == 0).all()
    assert table.note.str.contains("no results: none seed 0, 1, 2, 3, 4, 5").all()
    assert set(table.verdict) <= set(claims_rule.VERDICTS)


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
        ({"beta": [0.1, 0.3]}, "claims.c.beta"),
        ({"model": "llama"}, "claims.c.model"),
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
    0, and the error is the measurements' own, so one question's difference is not 'shown'."""
    candidate = pd.DataFrame({"value": [0.34, 0.35], "se": [0.05, 0.05]}, index=[0, 1])
    baseline = pd.DataFrame({"value": [0.35, 0.36], "se": [0.05, 0.05]}, index=[0, 1])
    test = claims_rule.paired_test(candidate, baseline, "seeds")
    assert test["se"] == pytest.approx(math.sqrt(4 * 0.05**2) / 2) and test["df"] == 1 and "own error" in test["note"]
    rule = {"alpha": 0.01, "min_z": 3, "q": 0.05, "fdr": "bh"}
    verdict = claims_rule.judge([test["effect"]], [test["se"]], [1], ["lower"], [math.nan], rule)["verdict"][0]
    assert verdict == "not shown"


def test_an_unknown_measurement_error_is_no_floor_at_all():
    """A run whose own error is unknown (NaN) leaves the floor unknown, not smaller: two seeds fall back to their
    spread."""
    candidate = pd.DataFrame({"value": [0.30, 0.40], "se": [math.nan, 0.5]}, index=[0, 1])
    baseline = pd.DataFrame({"value": [0.20, 0.20], "se": [0.5, 0.5]}, index=[0, 1])
    test = claims_rule.paired_test(candidate, baseline, "seeds")
    assert test["se"] == pytest.approx(np.std([0.1, 0.2], ddof=1) / math.sqrt(2)) and test["note"] == ""
    assert claims_rule.paired_test(candidate.assign(value=0.3), baseline, "seeds")["why"] == "no error estimate"


def test_a_claim_about_one_model_at_some_betas_is_judged_there_only(config):
    """`model` and a list of β: a row for that model at each listed β, none for the study's other models or β; each
    row judged on its own (config/paper.yaml's K1-in-the-loss claims, split as §4.1 words them)."""
    models = {**config["models"], "other": config["models"]["tiny"]}
    studies = {**config["studies"], "onpolicy": {**config["studies"]["onpolicy"], "models": ["tiny", "other"],
                                                 "betas": [0.1, 0.3, 1.0]}}  # fmt: skip
    claim = dict(config["claims"]["k1_loss_below_k1_reward"], model="other", beta=[0.3, 1.0])
    single = validate_config({**config, "models": models, "studies": studies, "claims": {"c": claim}})

    def level(metric, cell, base):  # k1-loss falls below k1-reward for the other model at β = 1 only
        falls = cell["model"] == "other" and cell["kl"] == "k1-loss" and cell["beta"] == 1.0
        return 0.5 if falls else 1.0

    table = claims.claims_table(single, synthetic_tables(single, level), TOY_TESTS)
    assert list(zip(table.model, table.beta, table.verdict, strict=True)) == [
        ("other", 0.3, "not shown"), ("other", 1.0, "shown")]  # fmt: skip


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
    digests = ["1a" * 32 if i % 2 else "2b" * 32 for i in range(len(tables["cells"]))]
    tables["cells"] = tables["cells"].assign(model=model, base_model_sha256=digests)
    table = claims.claims_table(single, tables, TOY_TESTS)
    assert len(table) and set(table.base_model) == {"1a1a1a1a1a1a, 2b2b2b2b2b2b"}
    assert set(claims.claims_table(single, synthetic_tables(single, lambda *_: 1.0), TOY_TESTS).base_model) == {""}


def test_the_caption_states_each_paths_promise_and_the_false_shown_rows_to_expect(config):
    names = directional(config)
    selected = {**config, "claims": {name: config["claims"][name] for name in names}}
    table = claims.claims_table(selected, synthetic_tables(selected, lambda *_: 1.0), TOY_TESTS)
    text = claims.caption(config, None, table)
    judged = int((table.predicted.isin(["higher", "lower"]) & table.q_value.notna()).sum())
    assert judged >= 20 and f"{judged} higher/lower rows judged" in text
    assert f"at most 0.01 × {judged} = {0.01 * judged:.2g} false shown rows expected" in text
    assert "Benjamini–Hochberg" in text and "q = 0.05" in text and "not testable" in text


def test_one_seed_is_not_testable_however_large_the_effect(config):
    """With one seed the spread between seeds is unknown: a claim built to be shown by 50 measurement errors is not
    testable, where the rule before called it shown (critical 3 on the measurement's error alone), and a second seed
    lost to a stopped run never makes it easier."""
    name = "k1_loss_offpolicy_below_k1_reward"  # one seed in config.yaml
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    single = validate_config({**raw, "claims": {name: raw["claims"][name]}})
    tables = synthetic_tables(single, built_for(single, single["claims"][name], -1.0))
    table = claims.claims_table(single, tables, TOY_TESTS)
    assert set(table.verdict) == {"not testable: one seed"} and (table.seeds == 1).all()
    assert (table.effect < -0.4).all() and table.z.isna().all()
    # Fig. 12's one seed is the divergence section's whole grid: no run of it is missing.
    fig12 = validate_config({**raw, "claims": {"f": raw["claims"]["forward_kl_lower_with_k3_loss"]}})
    row = claims.claims_table(fig12, synthetic_tables(fig12, lambda *_: 1.0), TOY_TESTS).iloc[0]
    assert row.verdict == "not testable: one seed" and "no results" not in row.note


def test_a_table1_claim_that_resolves_to_no_difference_without_a_margin_is_not_testable(config):
    """A table1 claim without a margin whose configuration Table 1 finds no pull for: the row says so (it raised a
    TypeError before)."""
    claim = {**config["claims"]["k1_reward_regularises"], "candidate": "k1-loss"}
    single = {**config, "claims": {"c": claim}}
    table = claims.claims_table(single, synthetic_tables(single, lambda *_: 1.0), TOY_TESTS)
    assert set(table.predicted) == {"same"} and set(table.verdict) == {"not testable: no margin"}


def test_one_evaluation_of_the_base_model_enters_the_error_once(config):
    """Against the base model's one lm-eval evaluation (error 0.05), six seeds that agree closely: the error of the
    difference is at least the base model's own, not that error averaged over six copies of it."""
    claim = {"text": "t", "metric": "evaluation", "study": "onpolicy", "candidate": "k1-reward", "baseline": "base",
             "predicted": "higher"}  # fmt: skip
    single = validate_config({**config, "claims": {"c": claim}})
    table = claims.claims_table(single, synthetic_tables(single, lambda *_: 1.0, sigma=0.05), TOY_TESTS)
    base_error = 0.05 / math.sqrt(len(config["evaluation"]["tasks"]))  # the mean over the tasks
    assert (table.se >= base_error).all() and (table.seeds == len(SEEDS)).all(), table[["se", "seeds"]]


def test_pairing_by_question_needs_the_same_questions(config):
    """Held-out pass@1 of async_math (math500) against the on-policy study (math_test): two question sets of the same
    length in these tables, which pairing by position would have matched question by question."""
    claim = {"text": "t", "metric": "heldout", "study": "async_math", "candidate": "k1-reward",
             "baseline": "k1-reward", "baseline_study": "onpolicy", "baseline_beta": "min", "predicted": "higher",
             "pair_by": "questions"}  # fmt: skip
    single = validate_config({**config, "claims": {"c": claim}})
    table = claims.claims_table(single, synthetic_tables(single, lambda *_: 1.0), TOY_TESTS)
    assert set(table.verdict) == {"not testable: different questions"}
    assert claims.heldout_questions(config, "async_math") != claims.heldout_questions(config, "onpolicy")
    assert claims.heldout_questions(config, "unbiased") == claims.heldout_questions(config, "onpolicy")


def test_a_run_stopped_early_moves_the_comparison_to_a_common_step_and_the_row_says_so(config):
    """K1 in the reward at β = 1, seed 2, collapsed after step 8 of 15: its KL claims are compared at step 8 (the K3
    of every run averaged over steps 4-8) and its held-out claims at step 5, the last evaluation every run made; the
    note names the run. A seed of an evaluated configuration that did not finish is left out of its evaluation claims,
    and the note says which."""
    names = ["k1_reward_regularises", "k1_loss_below_k1_reward", "k1_reward_beats_k3_loss_in_domain"]
    single = {**config, "claims": {name: config["claims"][name] for name in names}}
    stopped = {("onpolicy", "k1-reward", 1.0, 2): ("collapsed", 8)}
    table = claims.claims_table(single, synthetic_tables(single, lambda *_: 1.0, stopped=stopped), TOY_TESTS)
    at_one = table[table.beta == 1.0].set_index("claim")
    assert at_one.loc["k1_reward_regularises", "step"] == 8
    assert at_one.loc["k1_loss_below_k1_reward", "step"] == 5
    for name in names[:2]:
        assert "k1-reward β 1 seed 2 collapsed at step 8" in at_one.loc[name, "note"]
    evaluation = at_one.loc["k1_reward_beats_k3_loss_in_domain"]
    assert "left out seed 2" in evaluation.note and evaluation.seeds == len(SEEDS) - 1
    at_small = table[table.beta == 0.1]
    assert (at_small.step.fillna(15) == 15).all() and not at_small.note.str.contains("compared at|left out").any()


def test_a_non_finite_value_is_named_never_dropped(config):
    """No KL seed 3 logs a NaN K3 at step 12 (and the run goes on): the KL claims stop at step 11 and say why; the
    window mean of a run with a non-finite step is not the mean of the others."""
    single = one_claim(config, "k1_reward_regularises")
    tables = synthetic_tables(single, lambda *_: 1.0)
    training = tables["training"]
    bad = (training.kl == "none") & (training.seed == 3) & (training.step == 12)
    training.loc[bad, "kl_k3"] = math.nan
    table = claims.claims_table(single, tables, TOY_TESTS)
    assert (table.step == 11).all() and table.note.str.contains("none seed 3 non-finite final_kl at step 12").all()
    none = training[(training.kl == "none") & (training.study == "onpolicy")]
    final = aggregate.final_values(none, single).set_index("seed").kl_k3
    assert math.isnan(final[3]) and not math.isnan(final[2])


def test_a_row_shown_alone_but_not_within_the_tables_false_discovery_rate_is_not_shown():
    """z above critical (p below alpha) on its own, but one of 40 rows whose others are noise: the step-up procedure
    needs p ≤ q/40 of the smallest, and the row is not shown; alone in its table, it is."""
    rule = {"alpha": 0.01, "min_z": 3, "q": 0.05, "fdr": "bh"}
    effect = np.array([3.6] + [0.1] * 39)
    judged = claims_rule.judge(effect, np.ones(40), np.full(40, 5), ["higher"] * 40, np.full(40, np.nan), rule)
    assert judged["z"][0] >= judged["critical"][0] and judged["p"][0] <= rule["alpha"]
    assert judged["verdict"][0] == "not shown" and judged["q_value"][0] > rule["q"]
    alone = claims_rule.judge(effect[:1], [1.0], [5], ["higher"], [np.nan], rule)
    assert alone["verdict"][0] == "shown" and alone["q_value"][0] == pytest.approx(alone["p"][0])


@pytest.mark.parametrize(("rule", "message"), [({"q": 0}, "claims_rule.q"), ({"q": 0.7}, "claims_rule.q"),
                                               ({"fdr": "holm"}, "claims_rule.fdr")])  # fmt: skip
def test_the_claims_rule_is_checked_and_its_table_wide_rate_has_a_default(rule, message):
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    defaults = validate_config({**raw, "claims_rule": {}})["claims_rule"]
    assert defaults == {"alpha": 0.01, "min_z": 3, "q": 0.05, "fdr": "bh"}
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate_config({**raw, "claims_rule": rule})


def test_a_one_question_heldout_evaluation_has_an_unknown_standard_error():
    """One held-out prompt: no spread to estimate an error from, so the stderr is unknown (NaN: heldout.jsonl and the
    trackers take it as a number), not 0.0, which the claims table would have taken for an exact measurement."""
    from klstudy.train import cell

    class Model:
        training = True

        def eval(self):
            self.training = False

        def train(self, mode=True):
            self.training = mode

    class Trainer:
        accelerator = type("Accelerator", (), {"process_index": 0, "num_processes": 1})()
        model = Model()

        def _generate(self, prompts):
            return (None, None, None, ["The answer is \\boxed{7}."] * len(prompts), None, None, None, None)

    record = {"prompt": "3+4=?", "answer": "7", "reward": "math", "numbers": [], "target": 0, "choices": []}
    result = cell.heldout_pass_at_1(Trainer(), [record], seed=0, samples=2)
    assert result["pass_at_1"] == 1.0 and result["prompts"] == 1 and math.isnan(result["stderr"])
