"""What a sandboxed program's filesystem holds: its interpreter, nothing else of the host.

`interpreter_files(python)` asks the interpreter itself (a trusted run, once per process and
interpreter) which files it needs: the executable, its standard-library directories and every
shared library that it and its standard library's extension modules load, by the paths the
dynamic loader opened them with (``dl_iterate_phdr``). `_sandbox_boot.build_root` bind-mounts
exactly these, read-only, into an empty tmpfs that becomes the program's root; the
interpreter's ``site-packages`` is replaced by an empty directory.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

_MIN_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

# Run by each candidate interpreter (trusted, once per process): load every extension module of its
# standard library and list the shared objects the dynamic loader opened, by the paths it used.
_DISCOVER = r"""
import ctypes, json, os, sys, importlib
stdlib = [p for p in sys.path if os.path.isdir(p)]
for d in stdlib:
    if d.endswith("lib-dynload"):
        for name in sorted(os.listdir(d)):
            module = name.split(".")[0]
            if name.endswith(".so") and not module.startswith(("_test", "_xx", "xx", "_ctypes_test", "_tkinter")):
                try:
                    importlib.import_module(module)
                except Exception:
                    pass
try:
    ctypes.CDLL("libgcc_s.so.1")  # glibc loads it lazily for thread cancellation and unwinding
except OSError:
    pass
class Info(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p)]
libs = []
def found(info, size, data):
    name = info.contents.name
    if name and name.startswith(b"/"):
        libs.append(name.decode())
    return 0
callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)(found)
ctypes.CDLL(None).dl_iterate_phdr(callback, None)
site = [os.path.join(d, "site-packages") for d in stdlib if os.path.isdir(os.path.join(d, "site-packages"))]
print(json.dumps({"executable": os.path.realpath(sys.executable), "stdlib": stdlib, "libs": libs, "hide": site}))
"""
_INTERPRETER_FILES: dict[str, dict[str, Any]] = {}


def interpreter_files(python: str) -> dict[str, Any]:
    """What ``python`` needs to run: ``{"python", "binds", "hide"}`` for the sandbox's minimal root.

    ``binds``: the interpreter, its standard library directories and the shared libraries it and
    its extension modules load; ``hide``: directories inside those (site-packages) left empty."""
    if python not in _INTERPRETER_FILES:
        out = subprocess.run(
            [python, "-I", "-S", "-c", _DISCOVER],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(_MIN_ENV),
            stdin=subprocess.DEVNULL,
        )
        if out.returncode != 0:
            raise OSError(f"cannot list the files of {python}: {out.stderr[-300:]}")
        info = json.loads(out.stdout.strip().splitlines()[-1])
        dirs = [os.path.realpath(d) for d in info["stdlib"]]
        dirs = [d for d in dirs if not any(d.startswith(other + "/") for other in dirs)]  # lib-dynload is inside
        libs = [lib for lib in info["libs"] if not any(os.path.realpath(lib).startswith(d + "/") for d in dirs)]
        _INTERPRETER_FILES[python] = {
            "python": info["executable"],
            "binds": [info["executable"], *dirs, *libs],
            "hide": [os.path.realpath(d) for d in info["hide"]],
        }
    return _INTERPRETER_FILES[python]


__all__ = ["interpreter_files"]
