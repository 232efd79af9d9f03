"""The package's folders are its architecture: one subpackage per stage, in layers that import only downwards, no
circle of imports, no module longer than one sitting, and a short front door for users.

The layer order is written once, in the package's docstring (src/klstudy/__init__.py); these tests read it from
there and build the import graph from the source (ast: no import is executed), lazy imports in functions included.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "klstudy"
ENTRY = "entry"  # klstudy/__init__.py and __main__.py: the front door, above every layer
CORE = "core"  # the modules at the package's root
FILE_SUFFIXES = {"yaml", "yml", "md", "py", "json", "toml", "txt", "csv", "log"}  # klstudy.yaml is a file, not a module


def layer_order(package: Path = PACKAGE) -> list[str]:
    """The layers, lowest first, as the package's docstring lists them (an indented name, then two spaces)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()), clean=False) or ""
    return re.findall(r"^    ([a-z]+)  ", doc, re.M)


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """'klstudy.report.figures.paper' for src/klstudy/report/figures/paper.py; a package by its __init__."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path, package): path for path in sorted(package.rglob("*.py"))}


def layer_of(module: str, known: dict[str, Path]) -> str:
    """A module's layer: its subpackage's name; a module at the root is core; the package itself is the entry."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return ENTRY
    if len(parts) == 2 and known[module].name != "__init__.py":
        return CORE
    return parts[1]


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module's imports of the package's modules, written ones only (relative ones resolved)."""
    known = modules(package)
    return {name: {other for other in _imports(name, path, known) if other != name} for name, path in known.items()}


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """What ``from a.b import c`` imports: a.b.c where that is a module, else a.b; ``from .x import y`` resolved."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here.rsplit(".", node.level - 1)[0] if node.level else ""  # level 1: here; 2: its parent
            module = ".".join(filter(None, [base, node.module or ""]))
            found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names}
    return {other for other in found if other in known}


def with_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with what Python imports unasked: importing a.b.c runs a.b's __init__ first."""
    parent = {name: name.rpartition(".")[0] for name in graph if name.rpartition(".")[0] in graph}
    return {name: (targets | {parent[m] for m in (name, *targets) if m in parent}) - {name}
            for name, targets in graph.items()}  # fmt: skip


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """Every import from a lower layer to a higher one, as 'importer (layer) -> imported (layer)'."""
    order = [*layer_order(package), ENTRY]  # core first (test_the_layers_are_the_subpackages)
    known = modules(package)
    rank = {layer: i for i, layer in enumerate(order)}
    wrong = []
    for importer, targets in import_graph(package).items():
        for target in sorted(targets):
            low, high = layer_of(importer, known), layer_of(target, known)
            if rank.get(high, len(order)) > rank.get(low, -1):
                wrong.append(f"{importer} ({low}) -> {target} ({high})")
    return wrong


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in ``graph``, as the path that closes it, or None."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for other in sorted(graph.get(module, ())):
            if state.get(other) == "open":
                return [*path[path.index(other) :], other]
            if other not in state and (cycle := visit(other, [*path, other])):
                return cycle
        state[module] = "done"
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


# ------------------------------------------------------------------------------------------------------ the checks


def test_the_layers_are_the_subpackages():
    """Every subpackage is a layer of the docstring's list, and every layer but core is a subpackage."""
    order = layer_order()
    assert order[0] == CORE and len(order) == len(set(order)) >= 6, order
    subpackages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert sorted(order[1:]) == subpackages


def test_no_layer_imports_a_higher_one():
    assert upward_imports() == []


def test_the_package_has_no_circle_of_imports():
    graph = import_graph()
    assert "klstudy.run.stages" in graph["klstudy.run.cli"], "a top-level import is read"
    assert "klstudy.run.warm" in graph["klstudy.run.cli"], "so is one inside a function (cli imports warm lazily)"
    assert import_cycle(with_parents(graph)) is None


def test_every_dotted_name_of_the_package_names_a_module():
    """Strings that name a module (warm's preloads, `python -m klstudy.run.devices`, messages, docs) follow a move:
    each dotted reference to the package starts with a module that exists (a file such as envs/klstudy.yaml aside)."""
    known = modules()
    texts = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "workflow").rglob("*.smk"), ROOT / "Snakefile", ROOT / "Makefile", *(ROOT / "docs").glob("*.md"),
             ROOT / "README.md", *(ROOT / "workflow" / "schemas").glob("*.yaml")]  # fmt: skip
    stale = []
    for path in texts:
        for reference in set(re.findall(r"(?<![\w/-])klstudy(?:\.[A-Za-z_]\w*)+", path.read_text())):
            parts = reference.split(".")
            if parts[-1] in FILE_SUFFIXES:
                continue
            if not any(".".join(parts[:n]) in known for n in range(2, len(parts) + 1)):
                stale.append(f"{path.relative_to(ROOT)}: {reference}")
    assert stale == []


@pytest.mark.parametrize("subpackage", [p for p in sorted(PACKAGE.rglob("__init__.py")) if p.parent != PACKAGE],
                         ids=lambda p: str(p.parent.relative_to(PACKAGE)))  # fmt: skip
def test_each_subpackage_says_what_it_holds_and_what_it_may_import(subpackage):
    """Its docstring names each of its modules, and a layer's says which layers it may import: those below it."""
    doc = ast.get_docstring(ast.parse(subpackage.read_text()), clean=False) or ""
    held = sorted(p.stem for p in subpackage.parent.glob("*.py") if p.stem != "__init__")
    held += sorted(f"{p.name}/" for p in subpackage.parent.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    named = re.findall(r"^    ([\w/]+)  ", doc, re.M)
    assert sorted(named) == sorted(held), f"{subpackage}: its docstring lists {named}, it holds {held}"
    if subpackage.parent.parent == PACKAGE:
        order = layer_order()
        below = order[: order.index(subpackage.parent.name)]
        assert f"May import: {', '.join(below)}." in doc, f"{subpackage}: 'May import: {', '.join(below)}.'"


def test_the_core_is_the_modules_at_the_root():
    doc = (PACKAGE / "__init__.py").read_text()
    core = sorted(p.name for p in PACKAGE.glob("*.py") if not p.name.startswith("__"))
    line = re.search(r"^    core  .*?(?=^    \w+  )", doc, re.M | re.S).group()
    assert sorted(re.findall(r"\b\w+\.py\b", line)) == core


def test_a_user_script_imports_from_the_front_door_without_paying_for_the_trainer():
    """`from klstudy import KLTrainer, KLTrainerConfig, kl` works; `import klstudy` and the core import no torch."""
    code = (
        "import sys, klstudy, klstudy.kl, klstudy.config, klstudy.claims_rule, klstudy.progress;"
        "assert 'torch' not in sys.modules, 'the front door or the core imported torch';"
        "from klstudy import KLTrainer, KLTrainerConfig, kl;"
        "from klstudy.train.trainer import KLTrainer as T; assert KLTrainer is T and kl.__name__ == 'klstudy.kl';"
        "assert KLTrainerConfig.__module__ == 'klstudy.train.trainer'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
