"""`ServerGeneration` against stand-in servers (vLLM's own run in tests/engines): requests spread over the
servers with the colocated engine's sampling parameters and seeds, token ids in and out, versioned weight
pushes that every server confirms, and faults that end within their time limit with the server named."""

from __future__ import annotations

import time

import pytest
import torch

from rlvr_lightning.cli.errors.run_errors import explain_run_error
from rlvr_lightning.policies import SamplingConfig, ServerGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, PromptOptions
from rlvr_lightning.serving.client import RolloutServerError

SAMPLING = SamplingConfig(max_new_tokens=3, temperature=0.7)


def _generate(backend, model, prompts, n=2, generator=None, **kwargs):
    return backend.generate(
        model, None, prompts, n, SAMPLING, eos_token_ids=[2], pad_token_id=0, generator=generator, **kwargs
    )


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def test_requests_are_spread_over_the_servers_with_seeds_and_token_ids(servers):
    backend = ServerGeneration([s.address for s in servers])
    model = _model()
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8, 9, 10]]
    out = _generate(backend, model, prompts, generator=torch.Generator().manual_seed(3))

    # prompt i goes to server i % 2, as token ids, with the colocated engine's seeds (vllm_engine.py draws them so);
    # the requests are sent at once, so a server sees its own in any order
    assert sorted(b["prompt"] for b in servers[0].completions) == [[1, 2], [6]]
    assert sorted(b["prompt"] for b in servers[1].completions) == [[3, 4, 5], [7, 8, 9, 10]]
    seeds = torch.randint(0, 2**31 - 1, (4,), generator=torch.Generator().manual_seed(3)).tolist()
    sent = sorted(servers[0].completions + servers[1].completions, key=lambda b: prompts.index(b["prompt"]))
    assert [b["seed"] for b in sent] == seeds
    body = sent[0]
    assert (body["n"], body["max_tokens"], body["temperature"], body["logprobs"]) == (2, 3, 0.7, 0)
    assert body["stop_token_ids"] == [2] and body["ignore_eos"] and body["return_token_ids"]
    assert (body["top_p"], body["top_k"], body["min_p"]) == (1.0, 0, 0.0)  # the vLLM request's filters: off

    # rows i*n .. i*n+n-1 belong to prompt i; the server's token ids and log-probs as they came
    assert out.response_ids[:, 0].tolist() == [2, 3, 3, 4, 1, 2, 4, 5]
    assert out.response_ids[0].tolist() == [2, 7, 7]
    assert torch.equal(out.log_probs, torch.full((8, 3), -0.5))
    assert out.truncated.all() and not out.stopped_by_string.any()


def test_each_prompt_gets_its_own_token_budget(servers):
    # multi-turn rollouts (segmented_generation.py) continue rows with different budgets left
    backend = ServerGeneration([servers[0].address])
    out = _generate(backend, _model(), [[1], [2], [3]], n=1, max_new_tokens=[1, 3, 2])
    # the requests are sent at once: the server sees them in any order
    budgets = sorted((body["prompt"], body["max_tokens"]) for body in servers[0].completions)
    assert budgets == [([1], 1), ([2], 3), ([3], 2)]
    assert out.response_mask.sum(-1).tolist() == [1.0, 3.0, 2.0]


def test_weights_are_pushed_when_they_change_versioned_and_confirmed(servers, tmp_path):
    backend = ServerGeneration([s.address for s in servers], weight_dir=str(tmp_path))
    model = _model()
    first = _generate(backend, model, [[1]])
    _generate(backend, model, [[1]])  # unchanged weights: no push
    with torch.no_grad():
        model.weight.add_(1.0)
    third = _generate(backend, model, [[1]])
    assert [s.versions for s in servers] == [[1, 2], [1, 2]]
    assert servers[0].loaded_names[0] == ["bias", "weight"]
    assert (first.stats["engine/weight_version"], third.stats["engine/weight_version"]) == (1.0, 2.0)
    assert backend.weight_pushes == 2 and all(s.prefix_resets == 2 for s in servers)
    assert list(tmp_path.iterdir()) == []  # each pushed file removed once every server loaded it
    assert backend.exact_log_probs  # fp32 servers and trainer, no top-k/top-p


def test_tied_weights_are_pushed_under_each_name(servers, tmp_path):
    """safetensors refuses tensors that share memory: a tied output layer is written under both names, as the
    colocated engine receives it."""

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(5, 3)
            self.lm_head = torch.nn.Linear(3, 5, bias=False)
            self.lm_head.weight = self.embed_tokens.weight

    backend = ServerGeneration([servers[0].address], weight_dir=str(tmp_path))
    _generate(backend, Tied(), [[1]])
    assert servers[0].loaded_names == [["embed_tokens.weight", "lm_head.weight"]]


def test_an_unreachable_server_fails_within_the_startup_time_limit(servers):
    servers[1].stop()
    backend = ServerGeneration([servers[0].address, servers[1].address], startup_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(RolloutServerError, match=f"rollout server {servers[1].address} did not answer within 1.5 s"):
        _generate(backend, _model(), [[1]])
    assert time.monotonic() - started < 5


def test_a_server_that_dies_mid_run_is_named(servers):
    backend = ServerGeneration([s.address for s in servers], request_timeout_s=5)
    model = _model()
    _generate(backend, model, [[1], [2]])
    servers[1].stop()
    with pytest.raises(RolloutServerError, match=f"rollout server {servers[1].address}: generation request"):
        _generate(backend, model, [[1], [2]])


def test_a_response_cut_short_by_a_stopping_server_fails_the_step(servers):
    # vLLM answers the requests in flight when its server stops with what they had so far, finish_reason "abort":
    # trained on, those would be rollouts the policy never ended (a resumed run would leave the uninterrupted one)
    backend = ServerGeneration([servers[0].address])
    servers[0].finish_reason = "abort"
    with pytest.raises(RolloutServerError) as error:
        _generate(backend, _model(), [[1]])
    assert str(error.value).startswith(
        f"rollout server {servers[0].address}: a response ended with finish_reason 'abort', not 'stop' or 'length'"
    )
    servers[0].finish_reason = "stop"  # the end token or a stop string: complete
    out = _generate(backend, _model(), [[1]])
    assert not out.truncated.any()


def test_the_colocated_engine_refuses_a_response_cut_short_too():
    from rlvr_lightning.generation.engine_backend import completion

    done = completion([5, 6], [-0.5, -0.5], "stop", "</answer>", "vLLM engine")
    assert done.stopped_by_string and not done.truncated
    assert completion([5], [-0.5], "length", None, "vLLM engine").truncated
    for reason in ("abort", "error", None):
        with pytest.raises(RuntimeError, match=f"vLLM engine: a response ended with finish_reason {reason!r}"):
            completion([5], [-0.5], reason, None, "vLLM engine")


def test_a_weight_sync_over_its_time_limit_fails_within_it(servers):
    backend = ServerGeneration([s.address for s in servers], sync_timeout_s=0.5)
    servers[0].sync_delay = 3.0
    started = time.monotonic()
    with pytest.raises(RolloutServerError) as error:
        _generate(backend, _model(), [[1]])
    assert time.monotonic() - started < 3.0
    assert str(error.value) == (
        f"rollout server {servers[0].address}: weight sync (version 1) did not complete within 0.5 s"
    )
    # what `rlvr` prints instead of a traceback (status 1)
    problem = explain_run_error(RuntimeError("wrapped")) or explain_run_error(error.value)
    assert problem.status == 1
    assert problem.render().splitlines()[0] == f"error: {error.value}"


def test_servers_must_serve_one_dtype(servers):
    servers[1].dtype = "bfloat16"
    with pytest.raises(RolloutServerError, match="same model in the same dtype"):
        _generate(ServerGeneration([s.address for s in servers]), _model(), [[1]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"servers": []}, "servers=\\[\\] is empty"),
        ({"servers": ["localhost"]}, "'localhost' is not host:port"),
        ({"servers": ["a:1"], "weight_transport": "gloo"}, "weight_transport='gloo' is not valid"),
        ({"servers": ["a:1"], "sync_timeout_s": 0}, "sync_timeout_s"),
    ],
)
def test_bad_options_are_refused_before_any_work(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerGeneration(**kwargs)


@pytest.mark.parametrize("filters", [{"top_p": 0.9}, {"min_p": 0.1}])
def test_filtered_sampling_records_no_sampling_log_probs_and_warns(servers, make_policy, filters):
    # with top-p/top-k the servers' processed log-probs are renormalised over the kept tokens, as the colocated
    # engine's are: recorded as sampling log-probs, they would bias the mismatch metrics and rollout_is weights
    from rlvr_lightning.policies import hf

    backend = ServerGeneration([servers[0].address])
    policy = make_policy(prompt=PromptOptions(template="raw"), generation=GenerationOptions(backend=backend))
    hf.warn_renormalised_log_probs.cache_clear()
    filtered = SamplingConfig(max_new_tokens=3, **filters)
    with pytest.warns(UserWarning, match="renormalised over the kept tokens, so the rollouts record no sampling"):
        rollout = policy.sample({"prompt": ["a b", "c"]}, 2, filtered)
    assert backend.log_probs_renormalised and not backend.exact_log_probs
    assert rollout.sampling_log_probs is None
    unfiltered = policy.sample({"prompt": ["a b", "c"]}, 2, SamplingConfig(max_new_tokens=3))
    assert not backend.log_probs_renormalised and unfiltered.sampling_log_probs is not None
