"""SFTModule, its JSONL data module, teacher-forced pair rollouts and policy_from_checkpoint."""

import json

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.data import SortTask
from rlvr_lightning.data.sft_data import SFTDataModule, read_jsonl, write_jsonl
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import AggregationConfig, KLConfig
from rlvr_lightning.modules.pair_rollouts import pair_rollout, response_nll
from rlvr_lightning.modules.sft import SFTModule, policy_from_checkpoint
from rlvr_lightning.policies.hf_options import HFModelOptions, PromptOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward
from tests.script_modules import load_script


def toy(seed=0):
    torch.manual_seed(seed)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8, activation="tanh")


def sort_pairs(n, seed=0):
    task = SortTask(vocab_size=5, length=3, seed=seed)
    stream = iter(task.train_dataset())
    return [{"prompt": e["prompt"], "response": e["answer"]} for e in (next(stream) for _ in range(n))]


def trainer(steps=None, epochs=1, callbacks=(), **kwargs):
    return pl.Trainer(
        max_epochs=epochs,
        max_steps=steps or -1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **kwargs,
    )


# ------------------------------------------------------------------ the loss


def test_sft_loss_is_the_response_nll_by_hand():
    policy = toy()
    prompts, responses = [[3, 1, 2], [0, 4, 4]], [[1, 2, 3], [0, 4, 4]]
    rollout = pair_rollout(policy, prompts, responses)
    assert rollout.group_size == 1 and rollout.group_index.tolist() == [0, 1]
    assert rollout.response_mask.tolist() == [[1.0] * 3] * 2
    log_softmax = torch.log_softmax(policy(torch.tensor(prompts)), dim=-1)  # [2, 3, V]
    by_hand = -log_softmax.gather(-1, torch.tensor(responses).unsqueeze(-1)).mean()
    torch.testing.assert_close(response_nll(policy, rollout), by_hand)


def test_pair_rollout_rejects_a_response_the_toy_policy_cannot_score():
    with pytest.raises(ValueError, match="response_length=3, but response 1 of the batch has 2 tokens"):
        pair_rollout(toy(), [[1, 2, 3], [1, 2, 3]], [[1, 2, 3], [1, 2]])


def test_text_pairs_train_on_response_tokens_only(tokenizer_dir):
    from rlvr_lightning.demos.tiny_lm import tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        prompt=PromptOptions(template="raw"),
    )
    prompts, responses = ["What is 2+3?", "Numbers: 0 1 2"], [" The answer is 5.", " 3 4"]
    rollout = pair_rollout(policy, prompts, responses)
    tokenizer, eos = policy.tokenizer, policy.eos_token_ids[0]
    by_hand_terms = []
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        prompt_ids = tokenizer(prompt)["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
        # the response row holds exactly the response tokens and EOS, the mask nothing else
        assert rollout.response_ids[i, : len(response_ids)].tolist() == response_ids
        assert rollout.response_mask[i].sum().item() == len(response_ids)
        ids = torch.tensor([prompt_ids + response_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0]
        log_probs = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
        by_hand_terms.append(-log_probs.gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1))
    with torch.no_grad():
        nll = response_nll(policy, rollout)  # token-mean over both responses
    torch.testing.assert_close(nll, torch.cat(by_hand_terms).mean(), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer

    return save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


# ------------------------------------------------------------------ JSONL


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": [1, 2], "response": [1, 2]', "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ('{"prompt": [1, 2]}', "line 2: missing key\\(s\\) \\['response'\\]"),
        ('{"prompt": [1, 2], "response": 7}', "line 2: 'response' must be text or a list of token ids"),
        ('{"prompt": [1, 2], "response": ""}', "line 2: 'response' is empty"),
        ('{"prompt": {"a": 1}, "response": "x"}', "line 2: 'prompt' must be text, a list of token ids or"),
    ],
)
def test_a_malformed_line_names_the_file_and_the_line(tmp_path, line, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": [3, 1], "response": [1, 3]}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"{path}, {message}"):
        read_jsonl(path)


def test_jsonl_round_trip_keeps_metadata_and_skips_blank_lines(tmp_path):
    path = write_jsonl(
        [{"prompt": "2+3?", "response": "5", "answer": "5"}, {"prompt": [1], "response": [1]}], tmp_path / "p.jsonl"
    )
    path.write_text(path.read_text() + "\n\n")
    assert read_jsonl(path) == [{"prompt": "2+3?", "response": "5", "answer": "5"}, {"prompt": [1], "response": [1]}]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SFTDataModule(train_file=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="either val_file .* or val_task"):
        SFTDataModule(train_file=str(path), val_file=str(path), val_task=SortTask())


# ------------------------------------------------------------------ training, validation, hand-off


def test_sft_learns_sorting_pairs_and_hands_off_to_grpo(tmp_path):
    train = write_jsonl(sort_pairs(64), tmp_path / "train.jsonl")
    val = write_jsonl([{**p, "answer": p["response"]} for p in sort_pairs(32, seed=1)], tmp_path / "val.jsonl")
    pl.seed_everything(0)
    module = SFTModule(toy(), optimizer=lambda params: torch.optim.Adam(params, lr=0.03))
    data = SFTDataModule(train_file=str(train), val_file=str(val), batch_size=16)
    before = trainer(callbacks=[SortInclusionOrderingReward()], limit_val_batches=1).validate(
        module, data, verbose=False
    )[0]
    fit = trainer(epochs=25, callbacks=[SortInclusionOrderingReward()], check_val_every_n_epoch=25)
    fit.fit(module, data)
    after = fit.callback_metrics
    assert float(after["val/nll"]) < 0.5 * before["val/nll"]
    assert float(after["val/accuracy"]) > before["val/accuracy"] + 0.2
    assert {"train/loss", "val/reward_mean"} <= set(after)

    checkpoint = tmp_path / "sft.ckpt"
    fit.save_checkpoint(checkpoint)
    loaded = policy_from_checkpoint(toy(seed=1), str(checkpoint))
    for a, b in zip(loaded.state_dict().values(), module.policy.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    grpo = RLVRModule(loaded, group_size=2, kl=KLConfig(coef=0.1))  # the KL reference is the fine-tuned policy
    for a, b in zip(grpo.reference.parameters(), module.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_policy_from_checkpoint_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint_path='nope.ckpt' does not exist"):
        policy_from_checkpoint(toy(), "nope.ckpt")
    torch.save(ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=16).state_dict(), tmp_path / "other.pt")
    with pytest.raises(RuntimeError, match="do not fit ToySortPolicy .*same architecture"):
        policy_from_checkpoint(toy(), str(tmp_path / "other.pt"))
    plain = toy(seed=3)
    torch.save(plain.state_dict(), tmp_path / "plain.pt")  # a bare state dict works too
    torch.testing.assert_close(
        policy_from_checkpoint(toy(), str(tmp_path / "plain.pt")).embedding.weight, plain.embedding.weight
    )


def test_sft_options_are_checked():
    with pytest.raises(ValueError, match="aggregation.mode='seq-sum-constant' is not valid for a likelihood loss"):
        SFTModule(toy(), aggregation=AggregationConfig(mode="seq-sum-constant"))
    with pytest.raises(ValueError, match="ToySortPolicy has no save_pretrained"):
        SFTModule(toy(), save_pretrained_dir="out")


def test_sft_stage_config_runs_through_the_cli(in_tmp_dir):
    pipeline = load_script("sft_then_grpo")
    write_jsonl(pipeline.sort_pairs(40), in_tmp_dir / "train.jsonl")
    cli = pipeline.stage_cli(
        [
            "fit",
            "--config",
            str(pipeline.SFT_CONFIG),
            f"--data.init_args.train_file={in_tmp_dir / 'train.jsonl'}",
            "--trainer.max_epochs=1",
            "--trainer.limit_val_batches=1",
            "--trainer.check_val_every_n_epoch=1",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert isinstance(cli.model, SFTModule)
    assert cli.trainer.global_step == 2  # 40 pairs / 32 per batch
    assert "val/accuracy" in cli.trainer.callback_metrics
    assert (in_tmp_dir / "runs" / "sft_sort" / "sft.ckpt").is_file()


def test_jsonl_lines_can_be_text_for_language_models(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "response": "hello"}) + "\n")
    assert read_jsonl(path)[0]["prompt"][0]["content"] == "hi"


def test_a_fused_optimizer_is_clipped_under_bf16_mixed(tmp_path):
    """Lightning's automatic optimisation with `trainer.gradient_clip_val` refuses a fused optimizer under every
    mixed precision; under bf16-mixed SFT clips it as the same optimizer unfused."""
    train = write_jsonl(sort_pairs(16), tmp_path / "train.jsonl")

    def trained(fused: bool, clip: float | None = 1e-3) -> list[torch.Tensor]:
        pl.seed_everything(0)
        module = SFTModule(toy(), optimizer=lambda params: torch.optim.SGD(params, lr=0.5, fused=fused))
        fit = trainer(steps=2, precision="bf16-mixed", gradient_clip_val=clip, limit_val_batches=0)
        fit.fit(module, SFTDataModule(train_file=str(train), batch_size=8))
        return [p.detach().clone() for p in module.policy.parameters()]

    clipped = trained(fused=True)
    for a, b in zip(clipped, trained(fused=False), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(clipped, trained(True, clip=None), strict=True))
