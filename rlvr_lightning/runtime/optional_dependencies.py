"""Optional packages: a missing one is a short error that names the extra which installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

#: the extra of `pyproject.toml` that installs each optional package
EXTRAS = {"reasoning_gym": "envs", "verifiers": "envs"}


class MissingDependencyError(ImportError):
    """An optional package is not installed; the message says how to install it."""


def require(module: str, feature: str) -> ModuleType:
    """Import `module`, or raise `MissingDependencyError` naming `feature` and the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        extra = EXTRAS.get(module.split(".")[0])
        how = f"pip install 'rlvr-lightning[{extra}]'" if extra else f"pip install {module.split('.')[0]}"
        raise MissingDependencyError(f"{feature} needs the package {module.split('.')[0]!r}: {how}") from error


__all__ = ["EXTRAS", "MissingDependencyError", "require"]
