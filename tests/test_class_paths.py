"""Every `class_path` a shipped config or the documentation names resolves, spelled from a package's face.

Recipes name classes as `rlvr_lightning.<package>.<Name>` (e.g. `rlvr_lightning.policies.HFPolicy`), never by
the file that defines them, so moving a file inside a package never breaks a user's YAML."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLASS_PATH = re.compile(r"""["']?class_path["']?\s*:\s*["']?(rlvr_lightning[\w.]*)""")


def named_class_paths() -> dict[str, list[str]]:
    """Each rlvr_lightning class path in configs/, docs/ (examples included) and the README, with where it is."""
    files = [*REPO.glob("configs/**/*.yaml"), *REPO.glob("docs/**/*.md"), *REPO.glob("docs/examples/**/*")]
    found: dict[str, list[str]] = {}
    for path in [*files, REPO / "README.md"]:
        if not path.is_file() or path.suffix not in {".yaml", ".yml", ".md", ".py", ".ipynb"}:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in CLASS_PATH.finditer(line):
                found.setdefault(match.group(1), []).append(f"{path.relative_to(REPO)}:{number}")
    return found


NAMED = named_class_paths()


def test_the_configs_and_docs_name_many_classes():
    assert len(NAMED) >= 40, sorted(NAMED)


@pytest.mark.parametrize("class_path", sorted(NAMED))
def test_class_path_resolves_from_a_package_face(class_path: str):
    where = ", ".join(NAMED[class_path][:3])
    module_name, _, name = class_path.rpartition(".")
    module = importlib.import_module(module_name)
    assert hasattr(module, name), f"{class_path} ({where}) does not resolve"
    assert hasattr(module, "__path__") and module_name != "rlvr_lightning", (
        f"{class_path} ({where}) names a file; name it from its package, e.g. {module_name.rpartition('.')[0]}.{name}"
    )
    assert name in getattr(module, "__all__", ()), f"{class_path} ({where}): {module_name}.__all__ lacks {name}"


RUN_MODULE = re.compile(r"""-m["',\s]+(rlvr_lightning[\w.]*)""")


def named_run_modules() -> dict[str, list[str]]:
    """Each `python -m rlvr_lightning...` the scripts, docs and README run, with where it is."""
    files = [*REPO.glob("scripts/*"), *REPO.glob("docs/**/*.md"), *REPO.glob("configs/**/*.yaml"), REPO / "README.md"]
    found: dict[str, list[str]] = {}
    for path in files:
        if path.is_file() and path.suffix in {".sh", ".py", ".md", ".yaml"}:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in RUN_MODULE.finditer(line):
                    found.setdefault(match.group(1), []).append(f"{path.relative_to(REPO)}:{number}")
    return found


RUN_MODULES = named_run_modules()


def test_the_scripts_and_docs_run_modules():
    assert {"rlvr_lightning.cli", "rlvr_lightning.serving.serve"} <= set(RUN_MODULES), sorted(RUN_MODULES)


@pytest.mark.parametrize("module", sorted(RUN_MODULES))
def test_every_module_run_with_python_m_does_something(module: str):
    """`python -m X` runs X's `__main__.py` (a package) or X under `if __name__ == "__main__"` (a module);
    anything else exits 0 having done nothing."""
    spec = importlib.util.find_spec(module)
    where = ", ".join(RUN_MODULES[module][:3])
    assert spec is not None, f"{module} (run in {where}) does not exist"
    if spec.submodule_search_locations:  # a package
        assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{module} has no __main__ ({where})"
    else:
        assert '__name__ == "__main__"' in Path(spec.origin).read_text(), f"{module} runs nothing ({where})"
