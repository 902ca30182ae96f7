"""Fail fast when a config names a Hugging Face hub model or dataset and the hub cannot be reached.

Offline, `huggingface_hub` retries every request five times with back-off (about a minute and 170
lines of tracebacks) before the policy can say that the model is missing. Before anything is
built, the `rlvr` command looks for hub ids among the config's `name_or_path` and `tokenizer`
(`HFPolicy`'s `model` options), `model_name_or_path`, `tokenizer_name_or_path` (reward models) and
`dataset` values; if there is one and the hub does not answer within `PROBE_TIMEOUT_S`, it switches
`huggingface_hub` to offline mode: a model in the local cache still loads, a missing one fails at once
with the policy's message.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HUB_KEYS = ("name_or_path", "tokenizer", "model_name_or_path", "tokenizer_name_or_path", "dataset")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PROBE_TIMEOUT_S = 5.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_ids(config: Any) -> list[str]:
    """Values of `HUB_KEYS` anywhere in a (nested) config that look like hub ids and are not local paths."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in HUB_KEYS and isinstance(value, str) and HUB_ID.match(value) and not Path(value).exists():
                    found.append(value)
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(config)
    return found


def hub_reachable(endpoint: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Does the hub answer at all (any HTTP status counts)? Goes through the proxies of the environment."""
    endpoint = endpoint or os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def offline_mode() -> bool:
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes", "on") for name in OFFLINE_VARIABLES)


def go_offline_if_unreachable(config: Any) -> bool:
    """Switch to offline mode when the config names hub ids and the hub does not answer. Returns whether it did."""
    ids = hub_ids(config)
    if not ids or offline_mode() or hub_reachable():
        return False
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    try:  # already imported modules read the flag at call time from here
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    try:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    print(
        f"rlvr: the Hugging Face hub ({endpoint}) does not answer: using the local cache only for {', '.join(ids)}",
        flush=True,
    )
    return True
