"""Importing the frameworks' own KL and advantage code on a CPU, in the frameworks environment (`make frameworks-env`).

Each release pinned in envs/frameworks.txt is installed without its dependencies into a folder of its own,
``<venv>/frameworks/<name>-<version>`` (so that two releases of one package, TRL 1.9.2 and 1.16.0, can be loaded in
one process, one after the other); ``release_module`` imports a module from one of them.

The frameworks import, at package import, heavy modules that the functions under test never call (ray, deepspeed,
vLLM, flash-attn, ...); ``STAND_INS`` names each, with what imports it. While a release is imported, and only then,
those modules are stood in for by ``StandIn`` objects, which take any attribute, call, decoration or subclassing and
do nothing, so that a test fails (a StandIn where a tensor should be, or the module missing) if a tested function
ever reached one.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

# Where `make frameworks-env` installs each pinned release (envs/make-frameworks-env.sh).
FRAMEWORKS = Path(sys.prefix) / "frameworks"

# The modules stood in for, by framework (a release's name up to its version), each with what imports it at package
# import; no tested function calls any. A framework not named (TRL, polgrad) is imported with none.
STAND_INS = {
    "verl": {
        "ray": "verl.protocol (DataProto's workers) and the trainer's worker groups",
        "uvicorn": "verl's rollout HTTP servers (verl.workers.rollout)",
        "fastapi": "verl's rollout HTTP servers (verl.workers.rollout)",
    },
    "openrlhf": {
        "ray": "experiment making and the actors (openrlhf.trainer.ppo_utils.experience_maker, trainer.ray)",
        "deepspeed": "the training engine (openrlhf.models.utils: set_z3_leaf_modules; the DeepSpeed strategy)",
        "flash_attn": "ring attention (openrlhf.models.ring_attn_utils)",
        "vllm": "the rollout engines (openrlhf.trainer.ray.vllm_engine)",
        "pylatexenc": "the math answer grader (openrlhf.utils.math_utils)",
    },
    "skyrl": {
        "ray": "ppo_utils's function registries (they fall back to local ones when ray is not initialised)",
        "skyrl_gym": "SkyRL's environments (skyrl.train.config: the search environment's config)",
    },
    "areal": {
        "ray": "AReaL's launchers and schedulers (areal.infra)",
        "flask": "the RPC servers (areal.infra.rpc)",
        "lark": "the allocation-mode parser (areal.api.alloc_mode)",
        "uvloop": "the asynchronous task runner (areal.infra.async_task_runner, areal.api.cli_args)",
        "hydra": "the command-line config loader (areal.api.cli_args)",
        "numba": "sequence packing (areal.utils.seqpack: @numba.njit helpers)",
        "aiofiles": "the workflow executor (areal.infra.workflow_executor)",
        "openai": "the OpenAI-compatible client (areal.experimental.openai)",
        "swanlab": "an experiment logger (areal.utils.stats_logger)",
        "trackio": "an experiment logger (areal.utils.stats_logger)",
        "tensorboardX": "an experiment logger (areal.utils.stats_logger)",
        "pybase64": "the SGLang client (areal.engine.sglang_remote)",
    },
}

# Packages whose __init__ is not run (their submodules are imported from their real files): what the __init__ imports
# fails on a CPU or on this Python, and the tested functions need none of it.
INITS_SKIPPED = {
    "skyrl.backends": "imports skyrl.tinker.types (the Tinker API's types), whose typing.TypedDict pydantic refuses "
    "on Python < 3.12; ppo_utils and the worker need none of it",
}


class StandIn:
    """A name in a stood-in module: any attribute, call, decoration or subclassing succeeds and does nothing."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator (@ray.remote): the decorated object unchanged
        return StandIn(f"{self._name}(...)")

    def __getitem__(self, key):
        return StandIn(f"{self._name}[...]")  # a type annotation (Float[Tensor, "b t"])

    def __or__(self, other):
        return StandIn(f"{self._name} | ...")  # a union in an annotation evaluated at import

    __ror__ = __or__

    def __mro_entries__(self, bases):
        return (object,)  # used as a base class

    def __bool__(self):
        return False  # a check such as ray.is_initialized(): not started, not available

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self.__name__}.{attr}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every module under one of ``names``, before any real one."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


# Imported before any stand-in is in place, so that their probes of what is installed (transformers asks importlib
# whether deepspeed, flash_attn or vllm is there, and remembers) see this environment, not the stand-ins.
REAL_FIRST = ("torch", "transformers", "accelerate", "peft", "datasets")


@contextlib.contextmanager
def _stand_ins(names):
    """The stand-ins for ``names`` first on sys.meta_path while a release is imported. Afterwards neither it nor the
    stand-in modules remain: an availability probe (TRL asks importlib.util.find_spec("vllm")) finds none, and a
    tested function that imported one when called would fail. The imported modules keep the stand-ins they hold."""
    for name in REAL_FIRST:
        importlib.import_module(name)
    finder = _StandInFinder(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.partition(".")[0] in finder.names]:
            del sys.modules[name]


def release_dir(release: str) -> Path:
    """The folder of one pinned release, e.g. ``verl-0.9.0``."""
    return FRAMEWORKS / release


_LOADED: dict[tuple[str, str], types.ModuleType] = {}
_CURRENT: dict[str, str] = {}  # the release whose modules sys.modules holds, by top-level package


def release_module(release: str, name: str) -> types.ModuleType:
    """Module ``name`` of the pinned ``release`` (``"trl-1.9.2"``, ``"trl.trainer.grpo_trainer"``).

    The package's modules imported from another release are dropped from sys.modules first, and the release's
    folder is on sys.path only while importing: module objects keep their own globals, so the functions of two
    releases of one package can be used side by side once imported.
    """
    if (release, name) in _LOADED:
        return _LOADED[(release, name)]
    top = name.partition(".")[0]
    if _CURRENT.get(top) != release:
        for loaded in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[loaded]
        _CURRENT[top] = release
    folder = str(release_dir(release))
    with _stand_ins(STAND_INS.get(release.rpartition("-")[0], {})):
        sys.path.insert(0, folder)
        try:
            for package in INITS_SKIPPED:
                if package.partition(".")[0] == top and package not in sys.modules:
                    _without_init(package, release_dir(release))
            module = importlib.import_module(name)
        finally:
            sys.path.remove(folder)
    _LOADED[(release, name)] = module
    return module


def _without_init(package: str, folder: Path) -> None:
    """Put ``package`` in sys.modules as a bare package over its real folder, its __init__ not run (INITS_SKIPPED)."""
    path = folder.joinpath(*package.split("."))
    if not path.is_dir():
        return
    parent, _, child = package.rpartition(".")
    if parent:
        importlib.import_module(parent)
    module = types.ModuleType(package)
    module.__path__ = [str(path)]
    module.__spec__ = importlib.machinery.ModuleSpec(package, None, is_package=True)
    module.__spec__.submodule_search_locations = module.__path__
    sys.modules[package] = module
    if parent:
        setattr(sys.modules[parent], child, module)
