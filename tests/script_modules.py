"""The files under scripts/ loaded as modules for their tests (scripts/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str, module_name: str | None = None) -> ModuleType:
    """`scripts/<name>.py` run as the module `scripts_<name>` (or `module_name`: `<name>` itself is the name the scripts
    import each other by, with scripts/ on sys.path, so a test reads the module objects the script under test uses),
    a fresh one at each call, registered in `sys.modules` (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(module_name or f"scripts_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
