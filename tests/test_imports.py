"""Every module of the package imports: the check that each Python CI admits (`make test-core` under 3.12 and 3.13)
starts with, before the tests of what the modules compute."""

import importlib
import pkgutil

import pytest

PACKAGE = importlib.import_module("klstudy")
MODULES = sorted(m.name for m in pkgutil.walk_packages(PACKAGE.__path__, "klstudy.") if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    importlib.import_module(name)
