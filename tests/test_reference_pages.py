"""The reference pages say what the code does: docs/outputs.md's columns are the ones the cell and the aggregate write,
docs/kl-names.md's grammar is kl.py's, and docs/glossary.md defines the words the other pages lean on."""

import re
from pathlib import Path

import pytest
import yaml

from klstudy import config as configuration
from klstudy import kl
from klstudy.report import aggregate
from klstudy.train import cell

pytestmark = pytest.mark.docs  # the documentation tier: `make test-docs` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def first_column(text: str) -> set[str]:
    """The code names in the first cell of each row of the Markdown tables in ``text``."""
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def row_of(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| `{name}`"))


def test_the_metrics_columns_are_the_cells():
    text = section("outputs.md", "## A training cell")
    documented = first_column(text.split("Columns of `metrics.jsonl`")[1]) | set(re.findall(r"`(\w+)` counts", text))
    written = {"step", "optimizer_step", *cell.METRIC_KEYS, *cell.MEASURED_COLUMNS}
    assert documented == written


def test_the_grid_tables_columns_are_the_aggregates(tmp_path):
    text = section("outputs.md", "## The grid")
    cells = set(re.findall(r"`(\w+)`", text.split("| table |")[0].split("columns ")[1]))
    assert cells == set(aggregate.CELL_COLUMNS)
    own = {
        name: re.findall(r"`(\w+)`", row_of(text, f"{name}.csv").split("|")[3]) for name in aggregate.AGGREGATED_TABLES
    }
    assert own["evaluations"] == aggregate.EVALUATION_COLUMNS[len(aggregate.CELL_COLUMNS) :]
    assert own["divergence"] == aggregate.DIVERGENCE_COLUMNS[len(aggregate.CELL_COLUMNS) :]
    config = configuration.validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    assert own["cells"] == list(aggregate.cells_table(config, tmp_path).columns[len(aggregate.CELL_COLUMNS) :])


def test_the_name_grammar_is_kl_pys():
    text = (DOCS / "kl-names.md").read_text()
    grammar = section("kl-names.md", "## The grammar")
    assert re.findall(r"`(k\d)` =", grammar) == list(kl.ESTIMATORS)
    named = re.findall(r"`(\w+)`:", row_of(grammar, "PLACEMENT")) + ["both"]
    assert sorted(named) == sorted(p for p in kl.PLACEMENTS if p != "none")
    assert re.findall(r"`(\w+)`", row_of(grammar, "GRADIENT").split("|")[2]) == [*kl.LOSS_GRADIENTS[1:], kl.PATHWISE]
    gradients = section("kl-names.md", "## The loss gradients")
    assert first_column(gradients) - {"GRADIENT"} == set(kl.LOSS_GRADIENTS[1:])
    examples = re.search(r"Examples: (.*?)\. Not names: (.*?)\n\n", text, re.S)
    for name in re.findall(r"`(k\d[\w-]*|none)`", examples.group(1)):  # names, not the frameworks' keys
        assert kl.KLSpec.from_name(name, 0.1).name == name
    for name in re.findall(r"`([\w-]+)`", examples.group(2)):
        with pytest.raises(ValueError):
            kl.KLSpec.from_name(name, 0.1)


@pytest.mark.parametrize("word", ["cell", "study", "placement", "the rule", "separating design", "shown"])
def test_the_glossary_defines(word):
    headings = re.findall(r"^## (.+)$", (DOCS / "glossary.md").read_text(), re.M)
    assert any(word in heading.split(", ") or heading == word for heading in headings), headings
