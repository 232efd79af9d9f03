"""What a user reads says what the project does, not how or where it was made: no sentence about the machines, tools
or sessions of its development in the README, docs/ (docs/record/, the research record, aside), config/, envs/,
slurm/, the Makefile's comments or the package's messages; and every configuration is named where configurations
are listed."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_FILES = sorted(
    {ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md"), *(ROOT / "config").rglob("*"),
     *(ROOT / "envs").glob("*"), *(ROOT / "slurm").rglob("*"), *(ROOT / "src" / "klstudy").rglob("*.py"),
     *(ROOT / "workflow").rglob("*.yaml"), *(ROOT / "workflow").rglob("*.rst")}
)  # fmt: skip
# Phrases of a development log: where the project was made, by whom, with which tools, and the targets it set itself.
HISTORY = re.compile(
    r"stored snapshot|no one here|here has (?:seen|run)|(?:were|was) available here|was found to read"
    r"|(?:has|have) run (?:it|them) here|\(target <|this session|the sandbox|was lent|the device tool"
    r"|with another study beside it|on this (?:VM|sandbox)",
    re.I,
)


@pytest.mark.parametrize("path", [p for p in USER_FILES if p.is_file()], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_user_file_tells_the_projects_history(path):
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return
    found = [" ".join(m.group(0).split()) for m in HISTORY.finditer(" ".join(text.split()))]
    assert found == [], f"{path.relative_to(ROOT)}: history belongs in docs/record/ or an issue's note: {found}"


def test_the_history_phrases_are_found():
    assert HISTORY.search("version: main (stored snapshot)") and HISTORY.search("no GPU has run them here")
    assert not HISTORY.search("the snapshots for Fig. 12 are stored under results/")


def test_every_configuration_is_named_where_the_configurations_are_listed():
    intro = (ROOT / "config" / "README.md").read_text().split("\n## ")[0]
    listed = set(re.findall(r"\[`([\w.-]+\.yaml)`\]", intro))
    assert {p.name for p in (ROOT / "config").glob("*.yaml")} | {"config.yaml"} == listed


def test_the_newest_changelog_entry_is_the_packages_version():
    import tomllib

    import klstudy

    entries = re.findall(r"^## (\S+)", (ROOT / "docs" / "changelog.md").read_text(), re.M)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entries and entries[0] == version == klstudy.__version__


def test_the_claims_row_read_in_the_manual_is_the_shipped_tables():
    """docs/claims.md reads a row of docs/separation/claims.md: the row and every number said of it are the table's."""
    manual = (ROOT / "docs" / "claims.md").read_text()
    section = manual.split("## One row, read")[1].split("\n## ")[0]
    (row,) = [line for line in section.splitlines() if line.startswith("| k1_reward")]
    assert row in (ROOT / "docs" / "separation" / "claims.md").read_text().splitlines()
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    effect, se = (float(x) for x in re.match(r"(-?[\d.]+) ± ([\d.]+)", cells[3]).groups())
    z, critical = (float(x) for x in cells[5].split(" / "))
    prose = " ".join(section.split())
    assert f"is {effect:+.3f} nats".replace("+", "").replace("-", "−") in prose and f"error {se:.3f}" in prose
    assert f"{abs(effect):.3f} / {se:.3f} = {z:.1f}" in prose and f"t at 1 − alpha = 0.99 is {critical:.2f}" in prose
