"""The frameworks environment's pins (envs/frameworks*.txt), checked in the project's venv: test_frameworks.py runs
only in that environment, so a pin it does not use, or a release it uses that is not pinned, shows here."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.+-]*)$")


def pins(name: str) -> list[tuple[str, str]]:
    """(package, version) of every requirement line of envs/<name>; each must be an exact pin."""
    found = []
    for line in (ROOT / "envs" / name).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            match = PIN.match(line.strip())
            assert match, f"envs/{name}: {line!r} is not an exact pin (name==version)"
            found.append(match.groups())
    return found


def test_every_framework_release_pinned_is_checked_and_every_release_checked_is_pinned():
    pinned = {f"{package}-{version}" for package, version in pins("frameworks.txt")}
    tests = (ROOT / "tests" / "test_frameworks.py").read_text()
    used = set(re.findall(r'"((?:verl|openrlhf|skyrl|areal|trl|polgrad)-[0-9][0-9.]*)"', tests))
    assert pinned == used, f"pinned, not checked: {sorted(pinned - used)}; checked, not pinned: {sorted(used - pinned)}"


def test_the_frameworks_deps_are_pinned_and_none_is_the_projects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ours = {re.split(r"[=<>\[ ]", requirement)[0].lower() for requirement in project}
    deps = {package.lower() for package, _ in pins("frameworks-deps.txt")}
    assert not deps & ours, f"the project's venv has these already, at its own pins: {sorted(deps & ours)}"


def test_the_projects_trl_is_among_the_releases_checked():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    trl = next(requirement for requirement in project if requirement.startswith("trl=="))
    assert ("trl", trl.partition("==")[2]) in pins("frameworks.txt")
