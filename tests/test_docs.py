"""The documentation says what the code does: the README's size and its words, every command, path and link in the
user docs, the configuration reference against the schema, the paper's SLURM commands, and the citation files."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config
from workflow_helpers import expected_jobs, job_counts

from klstudy.run import config_reference

pytestmark = pytest.mark.docs  # the documentation tier: `make test-docs` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
USER_DOCS = [README, ROOT / "config" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Every file a user reads besides the pages: the configurations, the environments' scripts, the SLURM profile and the
# Makefile's comments.
USER_FILES = [
    *USER_DOCS,
    ROOT / "config.yaml",
    ROOT / "Makefile",
    *sorted(p for d in ("config", "envs", "slurm") for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix != ".md"),
    *sorted((ROOT / "workflow" / "schemas").glob("*.yaml")),
    *sorted((ROOT / "src" / "klstudy").rglob("*.py")),  # its messages and docstrings
]
ALL_DOCS = [*USER_DOCS, *sorted((ROOT / "docs" / "record").glob("*.md"))]
SLURM_MARK = "<!-- the paper on SLURM"

# How a page tells its history instead of the project's use: issue numbers, work sessions, pilot runs and seeds, items
# of an issue, what was once so, the machines the project was built on, and the maintainers' notes (DESIGN). A
# configuration named "pilot" is no history: only the phrasings of pilot runs are.
HISTORY = re.compile(
    r"\bissue #?\d+|(?<![\w/&#])#\d+\b|\bstop \d+\b|\bitem \d+\b"
    r"|\bpilot seeds?\b|\bpilots? [A-Z]\d*(?:\s*[–-]\s*[A-Z]\d*)?\b|\bpilots (?:tried|showed|found|ran)\b"
    r"|\b(?:this|that|the next|the previous|the last|an earlier|our) sessions?\b|\bour machines?\b"
    r"|\btoday'?s\b|\b(?:an|the|this config's) earlier run\b|\bwhich is (?:now )?fixed\b|\bCI caught\b"
    r"|\bthe old\b|\b(?:any|no) design tried\b|\bmeasured on one day\b|\bthe first reads?\b"
    r"|\b(?-i:DESIGN)\b"
    r"|stored snapshot|no one here|\bhere has (?:seen|run)\b|(?:were|was) available here|was found to read"
    r"|\b(?:has|have) run (?:it|them) here\b|\(target <|the sandbox|\bwas lent\b|the device tool"
    r"|with another study beside it",
    re.IGNORECASE,
)
HEX_WORD = re.compile(r"\b[0-9a-f]{7,40}\b")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------- the README's size


def table_cells(text: str) -> list[str]:
    """Every cell of every Markdown table in ``text`` (header and separator rows included)."""
    cells = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells += [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    return cells


def test_the_readme_is_a_five_minute_read():
    text = README.read_text()
    assert len(text.split()) <= 900, f"README.md is {len(text.split())} words; at most 900"
    longest = max(table_cells(text) or [""], key=lambda cell: len(cell.split()))
    assert len(longest.split()) <= 40, f"a README table cell of {len(longest.split())} words: {longest[:80]}…"


def test_the_user_pages_stay_within_their_budget():
    """The user pages (README.md, docs/*.md, docs/atlas/*.md; not the record, not the shipped runs' captions) at most
    26,000 words, as `cat README.md docs/*.md docs/atlas/*.md | wc -w` counts: a manual a user reads, not a record."""
    pages = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "atlas").glob("*.md"))]
    words = sum(len(page.read_text().split()) for page in pages)
    assert words <= 26_000, f"the user pages are {words} words; at most 26,000 (cut where a page repeats another)"


# ------------------------------------------------------------------------------------------- history words


def known_digests() -> set[str]:
    """Weight digests the configs pin (SHA-256, and the 12-digit prefix the claims captions print): not commits."""
    text = "\n".join(p.read_text() for p in [ROOT / "config.yaml", *(ROOT / "config").glob("*.yaml")])
    digests = set(re.findall(r"\b[0-9a-f]{64}\b", text))
    return digests | {d[:12] for d in digests}


def history_in(text: str, digests: set[str]) -> list[str]:
    """The words of ``text`` that tell how the project got here: issue numbers, sessions, pilots, commit hashes."""
    found = [m.group(0) for m in HISTORY.finditer(text)]
    found += [w for w in HEX_WORD.findall(text) if re.search(r"\d", w) and re.search(r"[a-f]", w) and w not in digests]
    return found


@pytest.mark.parametrize("page", USER_FILES, ids=rel)
def test_user_files_tell_no_history(page):
    """The README, docs/*.md, the configuration reference, the configs, envs/, slurm/ and the Makefile say what the
    project does and how to use it; how it got here is in docs/record/."""
    assert history_in(page.read_text(), known_digests()) == []


# ----------------------------------------------------------------------------- commands, paths and links exist


def code_of(text: str) -> list[str]:
    """The code of a Markdown page: its fenced blocks and inline code spans."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", makefile, re.M))


def tracked_top_level() -> set[str]:
    """The repository's own top-level files and folders (generated ones such as results/ and .venv/ are not)."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the repository's files from generated ones")
    return {line.split("/")[0] for line in listed.stdout.splitlines()}


def repository_paths(code: str, top_level: set[str]) -> list[str]:
    """Tokens of ``code`` that name a file or folder of the repository (a generated path, a placeholder such as
    {study} or <cell>, or an ellipsis is not one)."""
    paths = []
    for token in re.split(r"[\s=,;()'\"]+", code):
        token = token.split("::")[0].rstrip(".:")
        if re.fullmatch(r"[\w.\-/*]+", token) and (token.split("/")[0] in top_level) and ("/" in token or "." in token):
            paths.append(token)
    return paths


def links_of(text: str) -> list[str]:
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for link in links_of(page.read_text()):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(link)
    return broken


@pytest.mark.parametrize("page", ALL_DOCS, ids=rel)
def test_every_make_target_path_and_link_exists(page):
    text = page.read_text()
    code = "\n".join(code_of(text))
    missing_targets = set(re.findall(r"\bmake ([a-z][\w-]*)", code)) - make_targets()
    assert not missing_targets, f"{rel(page)} names make targets the Makefile lacks: {sorted(missing_targets)}"
    missing = [p for p in repository_paths(code, tracked_top_level()) if not list(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"{rel(page)} names paths that do not exist: {missing}"
    assert broken_links(page) == [], f"{rel(page)} links to what does not exist"


# --------------------------------------------------------------------------------- a command's output as shown


def shown_outputs(text: str) -> list[tuple[str, str]]:
    """(command, output) of each ```sh block of one command followed directly by a ```text block: what the command
    prints, as a page shows it."""
    return re.findall(r"^```sh\n([^\n]+)\n```\n\n```text\n(.*?)^```", text, re.M | re.S)


def shown_pattern(shown: str) -> re.Pattern:
    """The output a page shows as a pattern: "..." in a line stands for any text, a line of "..." alone for any
    lines."""
    lines = [r"(?:[^\n]*\n)*?" if line == "..." else r"[^\n]*".join(map(re.escape, line.split("..."))) + r"\n"
             for line in shown.rstrip("\n").split("\n")]  # fmt: skip
    return re.compile("".join(lines))


def test_a_shown_output_that_is_not_printed_is_caught():
    pattern = shown_pattern("setting: ... β = 0.02\n...\nlimits: ...\n")
    assert pattern.fullmatch("setting: k1, β = 0.02\nKL term\nits gradient\nlimits: a toy\n")
    assert not pattern.fullmatch("setting: k1, β = 0.03\nlimits: a toy\n")
    assert not pattern.fullmatch("setting: k1, β = 0.02\nits gradient\n")


@pytest.mark.parametrize("page", USER_DOCS, ids=rel)
def test_a_shown_output_is_what_its_command_prints(page):
    for command, shown in shown_outputs(page.read_text()):
        run = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert shown_pattern(shown).fullmatch(run.stdout), f"{rel(page)}: `{command}` now prints\n{run.stdout}"


# ------------------------------------------------------------------------------------- the configuration reference


def test_the_configuration_reference_is_the_schemas():
    expected = config_reference.reference()
    assert (ROOT / "config" / "README.md").read_text() == expected, (
        "config/README.md and workflow/schemas/config.schema.yaml disagree: run "
        "`.venv/bin/python -m klstudy config-reference --out config/README.md`"
    )


def test_every_key_of_the_schema_has_its_meaning():
    rows = [row for table in config_reference.tables() for row in table.rows]
    assert len(rows) > 150
    assert [row[0] for row in rows if not row[3]] == [], "keys without a description in the schema"


def test_the_reference_follows_the_schema():
    """A key added to the schema, with its type, default and description, appears in the reference; one without a
    description is caught."""
    from klstudy import config as configuration

    schema = configuration.load_schema()
    toy = schema["properties"]["toy"]["properties"]
    toy["jitter"] = {"description": "how much to shake", "type": "number", "minimum": 0, "default": 0.5}
    row = "| `toy.jitter` | number ≥ 0 | `0.5` | how much to shake |"
    assert row in config_reference.reference(schema)
    toy["quiet"] = {"type": "boolean"}
    assert ("toy.quiet", "boolean", "unset", "") in [r for t in config_reference.tables(schema) for r in t.rows]


# ------------------------------------------------------------------------------------------ the paper on SLURM


def slurm_block(page: Path) -> list[str]:
    """The lines of the fenced block after the SLURM marker of ``page``."""
    text = page.read_text()
    assert SLURM_MARK in text, f"{rel(page)} has no block of the paper's SLURM commands"
    block = re.search(r"```[^\n]*\n(.*?)```", text[text.index(SLURM_MARK) :], re.S)
    return [line for line in block.group(1).splitlines() if line.strip()]


def slurm_commands() -> list[str]:
    """docs/running.md's commands for the paper on SLURM: set-up, the pilot's preflight and run, the paper's dry run,
    run, status, report."""
    return slurm_block(ROOT / "docs" / "running.md")


def test_the_readme_gives_the_papers_slurm_commands_of_running_md():
    assert slurm_block(README) == slurm_commands()


def test_the_slurm_commands_run_snakemake_from_the_main_environment():
    commands = slurm_commands()
    snakemake = [c for c in commands if "snakemake" in c]
    assert snakemake and all(shlex.split(c)[0] == ".venv/bin/snakemake" for c in snakemake), snakemake
    assert all("--profile slurm" in c for c in snakemake)
    assert commands[:2] == ["make venv", "make vllm-env VLLM_FLAVOUR=gpu"], "the two environments first"


def test_the_papers_dry_run_is_the_documented_one(tmp_path):
    """The dry run of docs/running.md, on config/paper.yaml as the profile selects it, in an empty directory: it
    lists the paper's grid (the suite's one dry run of config/paper.yaml whole: its job counts are the config's), and
    every job that runs vLLM starts with the vLLM environment's interpreter."""
    dry_run = next(c for c in slurm_commands() if re.search(r"\s-n(\s|$)", c))
    words = shlex.split(dry_run)
    if not (ROOT / words[0]).exists():
        pytest.skip(f"{words[0]} is not built (make venv builds it)")
    run = subprocess.run(
        [str(ROOT / words[0]), *words[1:], "--directory", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout + run.stderr
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    merged = {}
    for name in words[words.index("--configfile") + 1 : words.index("-n")]:  # the paper's, then config/cluster.yaml
        update_config(merged, yaml.safe_load((ROOT / name).read_text()))
    assert job_counts(out) == expected_jobs(merged)
    vllm = str(ROOT / paper.get("vllm_python", ".venv-vllm/bin/python"))
    commands = [line.split("Shell command: ", 1)[1] for line in out.splitlines() if "Shell command: " in line]
    train = [c for c in commands if " -m klstudy train " in c]
    evaluate = [c for c in commands if " -m klstudy evaluate " in c]
    assert len(train) > 100 and len(evaluate) > 100, out[-3000:]
    vllm_studies = {name for name, study in paper["studies"].items() if study["train"].get("generation") == "vllm"}
    assert vllm_studies == set(paper["studies"]), "config/paper.yaml generates every rollout with vLLM"
    assert paper["evaluation"]["backend"] == "vllm"
    others = [c for c in commands if c not in train + evaluate]
    # after the attempt's header, in the group that also requeues a slice (train.smk)
    train = [c[c.rindex("; ", 0, c.index(" -m klstudy train")) + 2 :].removeprefix("{ ") for c in train]
    assert all(c.startswith(vllm) for c in train + evaluate), [c[:120] for c in train + evaluate if vllm not in c][:3]
    assert others and not any(vllm in c for c in others), "jobs without vLLM run with the interpreter of Snakemake"
    # The run's cost, computed from the config (klstudy/run/estimate.py), as README.md quotes it.
    assert "peak disk under results/: 5,206 GB" in out and "GPU-hours (estimate: every response" in out, out[:2000]
    assert "5.2 TB with 8 training at once" in README.read_text()


# -------------------------------------------------------------------------------------- licence and citation


def test_the_citation_file_cites_the_paper_and_the_project():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software" and citation["authors"]
    paper = citation["preferred-citation"]
    assert paper["title"] == "A Comedy of Estimators: On KL Regularization in RL Training of LLMs"
    assert [a["family-names"] for a in paper["authors"][:3]] == ["Shah", "Obando-Ceron", "Jain"]
    assert paper["doi"] == "10.48550/arXiv.2512.21852"
    bibtex = README.read_text().split("```bibtex")[1]
    assert paper["title"] in bibtex and "2512.21852" in bibtex
    project = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]
    assert citation["version"] == project["version"]
    assert citation["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")


if __name__ == "__main__":  # the words of a page that tell history: python tests/test_docs.py PAGE...
    for name in sys.argv[1:]:
        print(name, history_in(Path(name).read_text(), known_digests()))


# ---------------------------------------------------------------------------- the pages users ask for


def test_every_configuration_is_named_where_the_configurations_are_listed():
    intro = (ROOT / "config" / "README.md").read_text().split("\n## ")[0]
    listed = set(re.findall(r"\[`([\w.-]+\.yaml)`\]", intro))
    assert {p.name for p in (ROOT / "config").glob("*.yaml")} | {"config.yaml"} == listed


def test_the_newest_changelog_entry_is_the_packages_version():
    import tomllib

    entries = re.findall(r"^## (\S+)", (ROOT / "docs" / "changelog.md").read_text(), re.M)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    declared = re.search(r'^__version__ = "(.+)"', (ROOT / "src" / "klstudy" / "__init__.py").read_text(), re.M)
    assert entries and entries[0] == version == declared.group(1)


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


def test_the_module_map_names_every_module():
    modules_page = (ROOT / "docs" / "record" / "modules.md").read_text()
    package = ROOT / "src" / "klstudy"
    modules = {p.name for p in package.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    modules -= {p.name for p in (package / "evaluate" / "tasks").glob("*.py")}  # tasks/, named as a folder
    missing = sorted(name for name in modules if not re.search(rf"(?<![\w/]){re.escape(name)}\b", modules_page))
    assert missing == [], f"docs/record/modules.md does not name: {missing}"
