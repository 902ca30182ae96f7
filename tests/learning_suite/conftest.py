"""scripts/learning_suite.py loaded as its tests load it: `suite`, and `figures` (its registry)."""

import sys

import pytest

from tests.script_modules import SCRIPTS, load_script


@pytest.fixture(scope="module")
def suite():
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield load_script("learning_suite", module_name="learning_suite")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def figures(suite):
    return sys.modules["learning_figures"]
