"""docs/ reads as a manual: an index that lists every page, no heading that repeats its page's title,
and a configuration reference whose cells stay short (long defaults go under their table, and read back as the
schema's)."""

import re
from pathlib import Path

import pytest
import yaml

from klstudy import config as configuration

pytestmark = pytest.mark.docs  # the documentation tier: `make test-docs` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = ROOT / "config" / "README.md"
MAX_CELL_WORDS = 60


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES[1:], ids=rel)
def test_no_heading_repeats_the_pages_title(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    text = re.sub(r"^(.+)\n(=+|-+)$", lambda m: ("#" if m[2][0] == "=" else "##") + " " + m[1], text, flags=re.M)
    headings = re.findall(r"^(#+) (.+)$", text, re.M)  # a setext heading (Title / =====) counts as one too
    title = headings[0][1]
    assert [h for level, h in headings[1:] if h.startswith(title)] == []


def test_the_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {link.split("#")[0] for link in re.findall(r"\]\(([^)]+)\)", index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages - linked == set(), "pages the manual's index does not list"


def table_cells(text: str) -> list[str]:
    return [c.strip() for line in text.splitlines() if line.startswith("|") for c in re.split(r"(?<!\\)\|", line[1:-1])]


def test_the_configuration_references_cells_are_short():
    long = [cell[:60] for cell in table_cells(REFERENCE.read_text()) if len(cell.split()) > MAX_CELL_WORDS]
    assert long == [], f"cells over {MAX_CELL_WORDS} words in config/README.md (shorten the schema's description)"


def schema_default(path: str):
    schema = configuration.load_schema()
    node = schema
    for key in path.split("."):
        node = node["properties"][key]
        if "$ref" in node:
            node = {**schema["$defs"][node["$ref"].rsplit("/", 1)[-1]], **node}
    return node["default"]


def test_long_defaults_are_under_their_table_and_read_back_as_the_schemas():
    below = re.findall(r"^The default of `([\w.]+)`:\n\n```yaml\n(.*?)^```", REFERENCE.read_text(), re.M | re.S)
    assert below, "no default is long enough to go under its table: drop this test's expectation"
    for path, block in below:
        assert yaml.safe_load(block) == schema_default(path), path
        assert f"| `{path}` |" in REFERENCE.read_text() and "below the table" in REFERENCE.read_text()
