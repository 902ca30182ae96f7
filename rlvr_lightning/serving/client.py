"""One rollout server (vLLM's OpenAI server with our worker extension, `rlvr serve`) seen from the trainer:
JSON over HTTP, every call within a time limit, every failure a `RolloutServerError` naming the server and
what did not complete. Standard library only: the trainer's environment needs nothing more for the CPU path."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any


class RolloutServerError(RuntimeError):
    """A rollout server could not be reached, died, or did not complete a call within its time limit."""


class RolloutServerClient:
    def __init__(self, address: str) -> None:
        """`address`: "host:port" (or a URL "http://host:port")."""
        self.address = address.removeprefix("http://").rstrip("/")
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"rollout server address {address!r} is not host:port (e.g. localhost:8000)")
        self.url = f"http://{self.address}"

    def call(self, path: str, body: dict[str, Any] | None, timeout: float, what: str) -> Any:
        """POST `body` (GET when None) to `path` and return the decoded JSON answer (None when empty, the text when
        it is not JSON); a
        `RolloutServerError` saying `what` did not complete when the server is unreachable, fails, or does not
        answer within `timeout` seconds."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            method="GET" if data is None else "POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            raise RolloutServerError(
                f"rollout server {self.address}: {what} failed (HTTP {error.code}): {detail}"
            ) from None
        except TimeoutError:
            raise RolloutServerError(
                f"rollout server {self.address}: {what} did not complete within {timeout:g} s"
            ) from None
        except (urllib.error.URLError, ConnectionError, OSError) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise RolloutServerError(
                    f"rollout server {self.address}: {what} did not complete within {timeout:g} s"
                ) from None
            raise RolloutServerError(f"rollout server {self.address}: {what} failed: {reason}") from None
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:  # some endpoints answer plain text (`/v1/load_lora_adapter`)
            return text.decode(errors="replace")

    def wait_until_ready(self, timeout: float) -> None:
        """Poll `/health` until the server answers (it may still be loading), at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self.call("/health", None, max(min(left, 5.0), 0.1), "health check")
                return
            except RolloutServerError as error:
                if time.monotonic() + 0.5 >= deadline:
                    raise RolloutServerError(
                        f"rollout server {self.address} did not answer within {timeout:g} s ({error})"
                    ) from None
            time.sleep(0.5)

    def collective_rpc(self, method: str, timeout: float, what: str, **kwargs: Any) -> list[Any]:
        """Run our worker extension's `method(**kwargs)` on every worker of the server; their results."""
        body = {"method": method, "kwargs": kwargs, "timeout": timeout}
        answer = self.call("/collective_rpc", body, timeout, what)
        return answer.get("results", []) if isinstance(answer, dict) else []
