"""A stand-in for `rlvr serve` in the main environment (no vLLM): an HTTP server with the endpoints
`ServerGeneration` calls, answering completions with scripted tokens, and faults on demand."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # a request whose client gave up (the fault tests' time limits) fails when its answer is written, maybe
        # during a later test: socketserver would print that on stderr, where other tests read their messages
        pass


class FakeRolloutServer:
    def __init__(self, dtype: str = "float32", token: int = 7) -> None:
        self.dtype, self.token = dtype, token
        self.completions: list[dict[str, Any]] = []  # request bodies
        self.versions: list[int] = []  # weight versions loaded
        self.loaded_names: list[list[str]] = []
        self.loaded: list[dict[str, Any]] = []  # each load's tensors
        self.sync_delay = 0.0  # seconds a weight load takes
        self.finish_reason = "length"  # of every response; vLLM's "abort": cut short by a stopping server
        self.prefix_resets = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._answer({})
                elif self.path == "/v1/models":
                    self._answer({"data": [{"id": "tiny"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/v1/completions":
                    fake.completions.append(body)
                    self._answer({"choices": [fake.choice(body, i) for i in range(body["n"])]})
                elif self.path == "/collective_rpc":
                    self._answer({"results": [fake.rpc(body["method"], body.get("kwargs") or {})]})
                elif self.path == "/reset_prefix_cache":
                    fake.prefix_resets += 1
                    self._answer({})

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def choice(self, body: dict[str, Any], index: int) -> dict[str, Any]:
        """`max_tokens` tokens: the prompt's length + index, then `token`; log-prob -0.5 each."""
        tokens = [len(body["prompt"]) + index] + [self.token] * (body["max_tokens"] - 1)
        return {
            "index": index,
            "token_ids": tokens,
            "logprobs": {"token_logprobs": [-0.5] * len(tokens)},
            "finish_reason": self.finish_reason,
            "stop_reason": None,
        }

    def rpc(self, method: str, kwargs: dict[str, Any]) -> Any:
        if method == "rlvr_dtype":
            return self.dtype
        if method == "rlvr_load_weights":
            from safetensors import safe_open

            time.sleep(self.sync_delay)
            with safe_open(kwargs["path"], framework="pt") as handle:
                self.loaded_names.append(list(handle.keys()))
                self.loaded.append({name: handle.get_tensor(name) for name in handle.keys()})  # noqa: SIM118
            self.versions.append(kwargs["version"])
            return kwargs["version"]
        raise KeyError(method)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
