"""The counts docs/cost.md states are the configs' own: a grid changed in config.yaml or config/separation.yaml and not
in the page fails here, so the page cannot drift from the config it describes."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from klstudy import config as configuration

pytestmark = pytest.mark.docs  # the documentation tier: `make test-docs` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
COST = (ROOT / "docs" / "cost.md").read_text()


def load(*names: str) -> dict:
    """The configs merged as Snakemake merges several --configfile (mappings key by key, anything else replaced)."""

    def merge(into: dict, other: dict) -> dict:
        for key, value in other.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = copy.deepcopy(value)
        return into

    merged: dict = {}
    for name in names:
        merge(merged, yaml.safe_load((ROOT / name).read_text()))
    return configuration.validate_config(merged)


def stated(pattern: str) -> int:
    found = re.search(pattern, COST, re.S)
    assert found, f"docs/cost.md no longer says {pattern!r}"
    return int(found.group(1))


def test_the_default_grids_counts_are_the_configs():
    config = load("config.yaml")
    evaluation_jobs = len(configuration.evaluation_targets(config)) // len(config["evaluation"]["tasks"])
    assert stated(r"default grid is \d+ jobs: (\d+) training cells") == len(configuration.all_cells(config))
    assert stated(r"training cells, (\d+) evaluation\s+jobs") == evaluation_jobs
    assert stated(r"\((\d+) cells and the base model") == len(configuration.evaluated_cells(config))
    assert stated(r"(\d+) Fig\. 12 jobs") == len(configuration.divergence_targets(config))


def test_the_separating_designs_cells_are_the_configs():
    config = load("config.yaml", "config/separation.yaml")
    assert stated(r"separation\.yaml\"[^|`]*` \| \d+ jobs, (\d+) cells") == len(configuration.all_cells(config))
