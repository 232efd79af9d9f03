"""docs/atlas.md says what its run's table holds: the summary it leads with is written from docs/atlas/tables/atlas.csv
(the run of config/atlas.yaml) by the function that writes the run's own atlas.md, and the numbers its sentences
quote are read from that table here.

The same table holds docs/atlas/atlas.md's summary (the run's own page) and its figure (`klstudy redraw docs/atlas`)."""

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from klstudy.analysis import atlas
from klstudy.config import validate_config

pytestmark = pytest.mark.docs  # the documentation tier: `make test-docs` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "atlas.md").read_text()
BEGIN, END = "<!-- the run's summary: begin -->", "<!-- the run's summary: end -->"


@pytest.fixture(scope="module")
def shipped():
    from snakemake.utils import update_config  # how Snakemake merges an overlay

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "config" / "atlas.yaml").read_text()))
    section = validate_config(config)["toy"]["atlas"]
    return pd.read_csv(ROOT / "docs" / "atlas" / "tables" / "atlas.csv"), section


def test_the_page_leads_with_the_runs_summary(shipped):
    points, section = shipped
    block = PAGE.split(BEGIN)[1].split(END)[0]
    assert block.strip() == atlas.summary_markdown(points, section).strip()
    assert PAGE.index(BEGIN) < PAGE.index("## What the atlas computes")
    run_page = (ROOT / "docs" / "atlas" / "atlas.md").read_text()
    assert atlas.summary_markdown(points, section).strip() in run_page  # the run's own page says the same


def ratio(points, preset, family, beta) -> float:
    row = points[(points.preset == preset) & (points.family == family) & (points.beta == beta)].iloc[0]
    return float(row.beta_eff_ratio)


def test_the_headlines_quote_the_table(shipped):
    """Each number a headline sentence quotes, to the digits it shows, is the table's."""
    points, _ = shipped
    for preset, family, beta, shown in re.findall(r"<!-- ratio (\S+) (\w+) ([\d.]+) -->([\d.]+)", PAGE):
        assert f"{ratio(points, preset, family, float(beta)):.2f}" == shown, (preset, family, beta)
