"""Scoring through compiled decoder layers (`model.compile_layers`, `policies/compiled_layers.py`): the same
log-probs and gradients as the layers as written, one graph for every layer, forwards with a cache left as
written, and a KL reference (a deep copy) that computes with its own weights. `aot_eager` traces the layers as
inductor would but runs torch's own operators, so it checks the tracing on a CPU in seconds."""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.utils import counters

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies import compiled_layers
from rlvr_lightning.policies.compiled_layers import compile_decoder_layers
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions
from tests.packed_rows import uneven_rollout

CONFIG = tiny_llama_config(num_hidden_layers=3)


@pytest.fixture(autouse=True)
def _fresh_compiler():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    compiled_layers._FAILED.clear()


def _lean_modules(policy) -> int:
    return sum(isinstance(m.__dict__.get("forward"), functools.partial) for m in policy.model.modules()) - len(
        policy.model.get_decoder().layers
    )


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _scored(policy, rollout, temperature=0.7):
    policy.model.zero_grad()
    log_probs, _ = policy.token_log_probs(rollout, temperature)
    (log_probs.sum() / rollout.response_mask.sum()).backward()
    return log_probs.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_compiled_layers_score_as_the_layers_as_written(make_policy, lean, packed):
    policies = [
        make_policy(
            model=HFModelOptions(config=CONFIG, lean_activations=lean, compile_layers=mode),
            generation=GenerationOptions(share_prompt_prefix=False),
        )
        for mode in ("none", "aot_eager")
    ]
    rollout = uneven_rollout(policies[0].hf_config.vocab_size, seed=5)
    results = []
    for policy in policies:
        policy.packed_sequences = packed
        results.append(_scored(policy, rollout))
    assert _graphs() == 1  # one graph serves the three layers
    (eager, eager_grads), (compiled, compiled_grads) = results
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=0)
    assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) > 0
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=1e-6, rtol=0)
    longer = uneven_rollout(policies[0].hf_config.vocab_size, seed=6, response_lengths=[2, 17, 6, 1, 3, 9])
    _scored(policies[1], longer)
    _scored(policies[1], uneven_rollout(policies[0].hf_config.vocab_size, seed=7, response_lengths=[2, 19, 6, 1, 3, 9]))
    assert _graphs() == 2  # the second length made the graph dynamic; the third reuses it


@pytest.mark.parametrize("options", [{"lora": LoRAOptions(r=4)}, {"gradient_checkpointing": True}])
def test_lora_and_checkpointed_layers_score_as_written(make_policy, options):
    lora, model_options = options.get("lora", LoRAOptions()), {k: v for k, v in options.items() if k != "lora"}
    results = []
    for mode in ("none", "aot_eager"):
        model = HFModelOptions(config=CONFIG, compile_layers=mode, **model_options)
        policy = make_policy(model=model, lora=lora, generation=GenerationOptions(share_prompt_prefix=False))
        results.append(_scored(policy, uneven_rollout(policy.hf_config.vocab_size, seed=5)))
    (eager, eager_grads), (compiled, compiled_grads) = results
    assert _graphs() >= 1
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=0)
    assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) > 0
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=1e-5, rtol=0)


def test_forwards_with_a_cache_run_the_layers_as_written(make_policy):
    policy = make_policy(model=HFModelOptions(config=CONFIG, compile_layers="aot_eager"))
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=5)
    rollout.group_index = torch.tensor([0, 0, 0, 1, 1, 1])  # groups of 3 share their prompt
    rollout.prompt_ids[1:3], rollout.prompt_mask[1:3] = rollout.prompt_ids[0], rollout.prompt_mask[0]
    rollout.prompt_ids[4:], rollout.prompt_mask[4:] = rollout.prompt_ids[3], rollout.prompt_mask[3]
    policy.token_log_probs(rollout, 1.0)  # prefix-shared: prompts' caches, responses on top
    policy.sample({"prompt": ["12+3=", "4*5="]}, n=2, sampling=SamplingConfig(max_new_tokens=4))
    assert _graphs() == 0
    policy.share_prompt_prefix = False
    policy.token_log_probs(rollout, 1.0)
    assert _graphs() == 1


def test_the_kl_reference_scores_with_its_own_weights(make_policy):
    policy = make_policy(model=HFModelOptions(config=CONFIG, compile_layers="aot_eager"))
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=5)
    reference = policy.create_reference()
    for layer in reference.model.get_decoder().layers:
        assert layer.forward.args[0] is layer
    before = policy.reference_log_probs(reference, rollout, 1.0)
    with torch.no_grad():
        for parameter in policy.model.get_decoder().layers.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))  # an update of the policy
    after = policy.reference_log_probs(reference, rollout, 1.0)
    moved, _ = policy.token_log_probs(rollout, 1.0)
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert (moved - before).abs().max() > 1e-3
    assert _graphs() >= 1


def test_a_wrong_mode_names_the_option_and_the_choices():
    with pytest.raises(ValueError, match=r"compile_layers.*'inductor'.*aot_eager"):
        HFModelOptions(compile_layers="inductor")
    with pytest.raises(ValueError, match=r"compile_layers='default'.*Linear has no decoder layers"):
        compile_decoder_layers(torch.nn.Linear(2, 2), "default")


def test_auto_runs_the_layers_as_written_with_their_lean_forwards_off_a_cuda_device(make_policy):
    policy = make_policy(model=HFModelOptions(config=CONFIG), generation=GenerationOptions(share_prompt_prefix=False))
    assert (
        _lean_modules(policy) == 3 * CONFIG["num_hidden_layers"] + 1
    )  # two norms and the MLP per layer, the last norm
    _scored(policy, uneven_rollout(policy.hf_config.vocab_size, seed=5))
    assert _graphs() == 0 and _lean_modules(policy) == 3 * CONFIG["num_hidden_layers"] + 1


def _as_written_and_auto(make_policy) -> list:
    options = [HFModelOptions(config=CONFIG, compile_layers=mode) for mode in ("none", "auto")]
    return [make_policy(model=model, generation=GenerationOptions(share_prompt_prefix=False)) for model in options]


def test_auto_compiles_each_layer_without_its_lean_forwards_where_it_compiles(make_policy, monkeypatch):
    """On a CUDA device (stood in for here) `auto` drops a layer's lean forwards, then compiles it: one graph for every
    layer, the lean policy's log-probs and gradients."""
    monkeypatch.setattr(compiled_layers, "auto_compiles", lambda layer, hidden: True)
    monkeypatch.setattr(compiled_layers, "AUTO_MODE", "aot_eager")  # inductor's tracing, torch's operators
    policies = _as_written_and_auto(make_policy)
    rollout = uneven_rollout(policies[0].hf_config.vocab_size, seed=5)
    (eager, eager_grads), (compiled, compiled_grads) = (_scored(policy, rollout) for policy in policies)
    assert _graphs() == 1
    assert _lean_modules(policies[1]) == 1  # the final norm runs outside the layers
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=0)
    assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) > 0
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=1e-6, rtol=0)


def test_auto_warns_once_and_runs_the_layers_as_written_where_the_compiler_fails(make_policy, monkeypatch):
    def failing_backend(graph, example_inputs):
        raise RuntimeError("no working compiler here")

    monkeypatch.setattr(
        compiled_layers, "auto_compiles", lambda layer, hidden: type(layer) not in compiled_layers._FAILED
    )
    monkeypatch.setattr(
        compiled_layers, "compiled_forward", lambda forward, mode: torch.compile(forward, backend=failing_backend)
    )
    policies = _as_written_and_auto(make_policy)
    rollout = uneven_rollout(policies[0].hf_config.vocab_size, seed=5)
    eager, _ = _scored(policies[0], rollout)
    with pytest.warns(
        UserWarning, match=r"compile_layers='auto': compiling LlamaDecoderLayer failed.*no working compiler"
    ):
        fell_back, _ = _scored(policies[1], rollout)
    torch.testing.assert_close(fell_back, eager, atol=1e-6, rtol=0)
    assert (
        _lean_modules(policies[1]) == 3 * CONFIG["num_hidden_layers"] + 1
    )  # the layer tried got its lean forwards back
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _scored(policies[1], rollout)  # as written from then on, without trying again


def test_a_fit_with_layers_auto_compiled_trains_as_the_layers_as_written(tmp_path, monkeypatch):
    """`rlvr fit` with the KL reference, two inner epochs and micro-batches: where `auto` compiles (stood in for a CUDA
    device, aot_eager), the weights after two steps are those of the layers as written."""
    from rlvr_lightning.cli.app import main
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer
    from tests.test_lm_end_to_end import _config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(compiled_layers, "AUTO_MODE", "aot_eager")
    tokenizer = str(save_tiny_tokenizer(tmp_path / "tok"))
    trained = {}
    for compiles in (False, True):
        monkeypatch.setattr(compiled_layers, "auto_compiles", lambda layer, hidden, on=compiles: on)
        run = tmp_path / f"compiled_{compiles}"
        run.mkdir()
        policy = {
            "model": {"config": CONFIG, "tokenizer": tokenizer},
            "prompt": {"template": "{prompt}\nAnswer:"},
            "generation": {"share_prompt_prefix": False},
        }
        module = {"update": {"epochs": 2, "micro_batch_size": 4}, "kl": {"coef": 0.05}}
        task = {"examples": [{"prompt": "What is 2+3?"}, {"prompt": "Say ab."}]}
        trainer = {"limit_train_batches": 2, "limit_val_batches": 0}
        cli = main(["fit", "--config", str(_config(run, policy, module, trainer=trainer, task=task))])
        trained[compiles] = {k: v.detach().clone() for k, v in cli.model.policy.model.state_dict().items()}
    assert _graphs() >= 1
    assert trained[True].keys() == trained[False].keys()
    for name, value in trained[False].items():
        torch.testing.assert_close(trained[True][name], value, atol=1e-5, rtol=0)
