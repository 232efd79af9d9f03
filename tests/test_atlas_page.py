"""docs/atlas.md says what its run's table holds: the run's own page, docs/atlas/atlas.md, is what atlas.page writes
from docs/atlas/tables/atlas.csv (the run of config/atlas.yaml) and atlas_claims.csv, and the numbers docs/atlas.md's
sentences quote are read from that table here."""

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


@pytest.fixture(scope="module")
def shipped():
    from snakemake.utils import update_config  # how Snakemake merges an overlay

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "config" / "atlas.yaml").read_text()))
    section = validate_config(config)["toy"]["atlas"]
    return pd.read_csv(ROOT / "docs" / "atlas" / "tables" / "atlas.csv"), section


def test_the_runs_page_is_what_the_atlas_writes(shipped):
    from klstudy.report.figures.redraw import TABLE_MARK

    points, section = shipped
    judged = pd.read_csv(ROOT / "docs" / "atlas" / "atlas_claims.csv")
    run_page = (ROOT / "docs" / "atlas" / "atlas.md").read_text()
    assert run_page.split(TABLE_MARK, 1)[1] == "\n\n" + atlas.page(points, judged, section)
    assert "](atlas/atlas.md#your-framework-your-version-your-β)" in PAGE  # docs/atlas.md points to its table


def ratio(points, preset, family, beta) -> float:
    row = points[(points.preset == preset) & (points.family == family) & (points.beta == beta)].iloc[0]
    return float(row.beta_eff_ratio)


def test_the_headlines_quote_the_table(shipped):
    """Each number a headline sentence quotes, to the digits it shows, is the table's."""
    points, _ = shipped
    for preset, family, beta, shown in re.findall(r"<!-- ratio (\S+) (\w+) ([\d.]+) -->([\d.]+)", PAGE):
        assert f"{ratio(points, preset, family, float(beta)):.2f}" == shown, (preset, family, beta)


def test_the_page_counts_the_monte_carlo_disagreements():
    """A Monte Carlo end point that disagrees with the exact one (mc_agrees 0) is counted; one not checked is not."""
    text = atlas.agreement_text(pd.DataFrame({"mc_agrees": [1.0, 0.0, 0.0, float("nan")]}))
    assert "at 1 of the 3 end points it checked; the 2 others" in text
    assert atlas.agreement_text(pd.DataFrame({"beta": [0.1]})) == ""
