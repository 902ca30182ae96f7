"""verifiers environments (PrimeIntellect-ai/verifiers, its classic `vf.Environment` API) for our task, reward
and sampler: loading once per process, a rollout state without an inference client, and scoring by the rubric.

An environment is named by `environment` ("package.module", whose `load_environment(**env_args)` builds it, as
verifiers' own `vf.load_environment`; or "package.module:function") and built once per process for those
arguments: `VerifiersTask`, `VerifiersRubricReward` and `VerifiersTurns` naming the same environment share it.
The verifiers classic API is `import verifiers as vf` in verifiers 0.3.x (`verifiers.legacy`); 0.4 removed it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
from collections.abc import Mapping
from typing import Any

from rlvr_lightning.runtime.optional_dependencies import require

_ENVIRONMENTS: dict[tuple[str, str], Any] = {}


def load_environment(environment: str, env_args: Mapping[str, Any] | None = None):
    """The environment `environment` builds with `env_args` (built on the first call, then shared)."""
    vf = require("verifiers", f"the verifiers environment {environment!r}")
    key = (environment, json.dumps(dict(env_args or {}), sort_keys=True, default=repr))
    if key not in _ENVIRONMENTS:
        module_name, _, attribute = environment.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"environment={environment!r}: cannot import {module_name!r} ({error})") from error
        factory = getattr(module, attribute or "load_environment", None)
        if not callable(factory):
            raise ValueError(f"environment={environment!r}: {module_name} has no {attribute or 'load_environment'}()")
        env = factory(**dict(env_args or {}))
        if not isinstance(env, vf.Environment):
            raise ValueError(f"environment={environment!r} built a {type(env).__name__}, not a verifiers Environment")
        _ENVIRONMENTS[key] = env
    return _ENVIRONMENTS[key]


def run(awaitable_or_value):
    """The value of a verifiers coroutine, run to completion in this thread (plain values pass through)."""
    if inspect.isawaitable(awaitable_or_value):

        async def wait():
            return await awaitable_or_value

        return asyncio.run(wait())
    return awaitable_or_value


def plain_messages(messages) -> list[dict[str, Any]]:
    """verifiers messages (pydantic or dicts, or a string) as `[{"role": ..., "content": ...}]` for chat templates."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    plain = []
    for message in messages:
        if not isinstance(message, Mapping):
            message = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else vars(message)
        plain.append({"role": message["role"], "content": message.get("content") or ""})
    return plain


def plain_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset row with its prompt as plain messages (what an example carries as `vf_input`)."""
    row = dict(row)
    if "prompt" in row:
        row["prompt"] = plain_messages(row["prompt"])
    return row


@functools.cache
def _policy_client_class():
    from verifiers.legacy.clients.client import Client

    class PolicyClient(Client):
        """A stand-in for verifiers' inference client: our policy samples, nothing calls this."""

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            raise NotImplementedError("rlvr_lightning samples with its policy, not through a verifiers client")

        to_native_prompt = get_native_response = raise_from_native_response = from_native_response = to_native_tool

        async def close(self):
            return None

    return PolicyClient


def _policy_client():
    return _policy_client_class()(None)


def new_state(env, row: Mapping[str, Any]):
    """A fresh rollout state for dataset `row`, as `env.init_state` and `env.setup_state` make it. The client (a
    stand-in: nothing samples through it) and the token-usage tracker (verifiers counts an inference client's
    usage) are removed, so the state pickles (rollouts travel in checkpoints)."""
    state = run(env.init_state(dict(row), client=_policy_client(), model="rlvr_lightning-policy"))
    state["client"] = None
    for key in ("usage_tracker", "usage"):
        state.pop(key, None)
    setup = getattr(env, "setup_state", None)  # the environment's own fields (`MultiTurnEnv.setup_state`)
    if setup is not None:
        state = run(setup(state)) or state
    return state


def normalize(messages):
    from verifiers.legacy.utils.message_utils import normalize_messages

    return normalize_messages(messages)


def reward_terms(env) -> list[tuple[str, Any, float, Any]]:
    """`(name, function, weight, rubric)` of every reward function of the environment's rubric (nested rubric
    groups flattened); functions of weight 0 are metrics and left out. Group reward functions are refused."""
    terms, stack = [], [env.rubric]
    while stack:
        rubric = stack.pop(0)
        if hasattr(rubric, "rubrics"):
            stack[:0] = list(rubric.rubrics)
            continue
        for function, weight in zip(rubric.funcs, rubric.weights, strict=True):
            name = getattr(function, "__name__", repr(function))
            if rubric._is_group_func(function):
                raise ValueError(f"reward function {name!r} scores a whole group: group rewards are not supported")
            if weight != 0:
                terms.append((name, function, float(weight), rubric))
    if not terms:
        raise ValueError("the environment's rubric has no reward function of non-zero weight")
    return terms


def call_reward(function, rubric, state) -> float:
    """One reward function on one state, its arguments chosen by name as verifiers does; errors propagate
    (verifiers' own `Rubric` turns them into 0; here they fail the row and are counted)."""
    objects = rubric.score_objects(state)
    parameters = inspect.signature(function).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        objects = {k: v for k, v in objects.items() if k in parameters}
    return float(run(function(**objects)))


__all__ = [
    "call_reward",
    "load_environment",
    "new_state",
    "normalize",
    "plain_messages",
    "plain_row",
    "reward_terms",
    "run",
]
