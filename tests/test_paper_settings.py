"""The paper's settings (config/paper-settings.yaml) against config/paper.yaml, the page written from them
(docs/paper-settings.md), and every reference to the paper's sections, figures and tables in the configs."""

import copy
import re

import pytest
import yaml
from workflow_helpers import ROOT

from klstudy.config import validate_config
from klstudy.run import paper_settings

PAPER_TEXT = ROOT.parent / "shared" / "paper" / "comedy-of-estimators.md"
CONFIGS = ["config.yaml", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config").glob("*.yaml"))]


@pytest.fixture(scope="module")
def mapping():
    return paper_settings.load()


@pytest.fixture(scope="module")
def paper_config():
    return validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))


def test_every_setting_the_mapping_checks_is_the_paper_configs(mapping, paper_config):
    assert paper_settings.mismatches(paper_config, mapping) == []


def test_a_setting_changed_in_the_config_is_found(mapping, paper_config):
    changed = copy.deepcopy(paper_config)
    changed["studies"]["async_math"]["train"]["batch_prompts"] = 512
    del changed["studies"]["unbiased"]["kl"]
    changed["studies"]["async_countdown"]["train"]["weight_decay"] = 0.1  # a row's `studies.*`: every study
    found = paper_settings.mismatches(changed, mapping)
    assert any(f.startswith("studies.async_countdown.train.weight_decay: the config has 0.1") for f in found), found
    assert any(f.startswith("studies.async_math.train.batch_prompts: the config has 512") for f in found), found
    assert "studies.unbiased.kl: not in the config" in found


def test_every_setting_a_run_uses_is_stated_or_read(mapping, paper_config):
    """Each key under the sections a run reads is a row's (the paper's words, and a reading where it is not stated) or
    a not_settings entry's (why it is no setting of the paper's)."""
    assert paper_settings.uncovered(paper_config, mapping) == []


def test_a_setting_with_neither_a_row_nor_a_reason_is_found(mapping, paper_config):
    trimmed = copy.deepcopy(mapping)
    trimmed["settings"] = [row for row in mapping["settings"] if "weight_decay" not in str(row.get("key"))]
    found = paper_settings.uncovered(paper_config, trimmed)
    assert found == [f"studies.{study}.train.{key}" for study in paper_config["studies"]
                     for key in ("weight_decay", "max_grad_norm")]  # the optimiser's row named both  # fmt: skip
    changed = copy.deepcopy(paper_config)
    changed["divergence"]["temperature"] = 0.7  # a key no row names
    assert paper_settings.uncovered(changed, mapping) == ["divergence.temperature"]


def test_a_key_with_several_studies_is_checked_in_each():
    row = {"paper": "x", "key": ["studies.{a,b}.train.steps", "studies.*.seed", "toy.trials"], "value": [250, 0, 200]}
    assert paper_settings.keys_and_values(row, ["a", "c"]) == [
        ("studies.a.train.steps", 250), ("studies.b.train.steps", 250), ("studies.a.seed", 0), ("studies.c.seed", 0),
        ("toy.trials", 200)]  # fmt: skip


def test_the_page_is_what_the_mapping_gives(mapping):
    committed = (ROOT / "docs/paper-settings.md").read_text()
    assert committed == paper_settings.page(mapping), (
        "docs/paper-settings.md is stale: .venv/bin/python -m klstudy paper-settings --out docs/paper-settings.md"
    )


@pytest.mark.parametrize("name", CONFIGS)
def test_every_reference_to_the_paper_names_what_it_has(mapping, name):
    """Each claim's `paper:` in every config, and each row's `where`, names sections, figures and tables that exist."""
    config = yaml.safe_load((ROOT / name).read_text())
    wheres = [claim["paper"] for claim in (config.get("claims") or {}).values() if "paper" in claim]
    if name == "config/paper-settings.yaml":
        wheres = [row["where"] for row in mapping["settings"]]
    for where in wheres:
        assert paper_settings.unknown_references(where, mapping["paper"]) == [], (name, where)


def test_references_the_paper_does_not_have_are_found(mapping):
    found = paper_settings.unknown_references("§3.4, Fig. 14, Table 4, §2.1, Fig. 5, 6, 10, Fig. 9 left, Fig. 2-4, B",
                                              mapping["paper"])  # fmt: skip
    assert found == ["§3.4", "Fig. 14", "Table 4", "§2.1"]


def test_a_row_without_its_reading_is_refused(tmp_path):
    text = (ROOT / "config/paper-settings.yaml").read_text()
    broken = tmp_path / "settings.yaml"
    broken.write_text(re.sub(r"    reading: >-\n(      .*\n)+", "", text, count=1))
    with pytest.raises(ValueError, match=r"settings\[\d+\] \(read\) says no reading"):
        paper_settings.load(broken)


@pytest.mark.skipif(not PAPER_TEXT.exists(), reason=f"the paper's text is not at {PAPER_TEXT}")
def test_the_mappings_list_of_sections_figures_and_tables_is_the_papers(mapping):
    text = PAPER_TEXT.read_text()
    headings = re.findall(r"^([1-9]|[A-F])((?:\.\d+)*) \**([A-Z][A-Z0-9 ,\-²]+)", text, re.M)  # "F.4 **K3** ..."
    sections = [number + sub for number, sub, title in headings if not title.startswith("COMEDY")]  # not the title
    assert sections == mapping["paper"]["sections"]
    assert max(int(n) for n in re.findall(r"^Figure (\d+):", text, re.M)) == mapping["paper"]["figures"]
    assert max(int(n) for n in re.findall(r"^Table (\d+):", text, re.M)) == mapping["paper"]["tables"]


def _plain(text: str) -> str:
    """The paper's markdown as a reader quotes it: inline maths unwrapped, emphasis and code marks dropped, β and ω
    as letters, whitespace collapsed."""
    text = re.sub(r"\$([^$]*)\$", r"\1", text).replace("`", "").replace("*", "")
    for latex, letter in (("\\beta", "β"), ("\\omega", "ω"), ("\\neq", "≠"), ("^{-6}", "^-6"), ("_{t}", "_t")):
        text = text.replace(latex, letter)
    return " ".join(text.split())


def _quotes(path) -> list[str]:
    """Every quotation of the paper in a mapping's ``paper`` fields: a field written in double quotes whole, or each
    "…" inside one; each split at its ellipses into the runs of words it quotes."""
    root = yaml.compose((ROOT / path).read_text())
    quoted = []
    for section, rows in root.value:
        if section.value not in ("settings", "claims_not_encoded"):
            continue
        for row in rows.value:
            for key, value in row.value:
                if key.value == "paper":
                    quoted += [value.value] if value.style == '"' else re.findall(r'"([^"]+)"', value.value)
    return [run.strip(" ,.;") for quote in quoted for run in quote.split("…") if run.strip(" ,.;")]


@pytest.mark.skipif(not PAPER_TEXT.exists(), reason=f"the paper's text is not at {PAPER_TEXT}")
def test_every_quotation_is_the_papers_words():
    paper = _plain(PAPER_TEXT.read_text())
    runs = _quotes("config/paper-settings.yaml")
    assert len(runs) > 40 and [run for run in runs if _plain(run) not in paper] == []
    assert _plain("sample 5 rollouts per prompt (i.e. group size G = 4)") in paper
    assert _plain("sample 5 rollouts per prompt during training") not in paper  # an elision written as words


def test_the_paper_cells_train_without_trls_vllm_correction_and_with_verls_k3_clamp(paper_config, tmp_path):
    """The key reaches TRL: GRPOConfig's vllm_importance_sampling_correction, off for the paper, TRL's default (on)
    where a config does not set it."""
    from klstudy.config import cell_settings
    from klstudy.train.cell import trainer_config

    cell = cell_settings(paper_config, "async_math", "qwen2.5-7b", "k3-loss", 0.005, 0)
    args = trainer_config(cell, tmp_path)
    assert args.vllm_importance_sampling_correction is False
    assert args.kl_spec().clamp == 10  # verl's low_var_kl clamp, as the paper's K3 runs had it
    assert args.policy_loss == "truncated_is"  # prime-rl's weighing of stale tokens
    assert (args.weight_decay, args.max_grad_norm, args.lr_scheduler_type) == (0.01, 1.0, "constant")  # its optimiser
    onpolicy = cell_settings(paper_config, "onpolicy", "qwen2.5-7b", "k3-loss", 0.1, 0)
    assert trainer_config(onpolicy, tmp_path).policy_loss == "ppo_clip"  # verl's PPO clip
    default = copy.deepcopy(cell)
    default["train"]["vllm_importance_sampling"] = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))[
        "studies"
    ]["onpolicy"]["train"]["vllm_importance_sampling"]
    assert trainer_config(default, tmp_path).vllm_importance_sampling_correction is True


def test_the_saving_the_unbiased_row_weighs_is_the_estimates(mapping, paper_config):
    """The GPU-hours that reusing onpolicy's cells would save, as the estimate computes them (run/estimate.py)."""
    from klstudy.run import estimate

    trimmed = copy.deepcopy(paper_config)
    trimmed["studies"]["unbiased"]["kl"] = ["k1-both", "k3-both"]  # without the two onpolicy also trains
    total = estimate.gpu_hours(paper_config).parts["training"]
    saved = total - estimate.gpu_hours(trimmed).parts["training"]
    row = next(row for row in mapping["settings"] if row.get("key") == "studies.unbiased.kl")
    assert f"about {saved:.0f} GPU-hours, {100 * saved / total:.1f} % of the training estimate" in " ".join(
        row["reading"].split()
    )
