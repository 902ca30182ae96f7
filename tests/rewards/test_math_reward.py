"""MathAccuracyReward: scoring, correctness, answers, verifier lifecycle, and a hostile row inside a Trainer run.

Also home of the scripted text policy and rollout builder used by the evaluation and rollout-table tests.
"""

from __future__ import annotations

import copy
import pickle

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from rlvr_lightning.data.datamodule import RLVRDataModule
from rlvr_lightning.data.sort_task import ListDataset
from rlvr_lightning.data.task import Task
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rewards.math import MathAccuracyReward
from rlvr_lightning.rollout import Rollout

HOSTILE = r"\boxed{9^{9^{9^9}}}"  # sympy never finishes this: the worker is killed at the budget


# ----------------------------------------------------------------------------- helpers (shared)


def make_rollout(texts, metadata=None, group_size=None, prompts=None, lengths=None) -> Rollout:
    """A text rollout: one row per text; response length = `lengths` or the number of characters."""
    n = len(texts)
    group_size = group_size or n
    lengths = lengths or [max(1, len(t)) for t in texts]
    width = max(lengths)
    mask = torch.zeros(n, width)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return Rollout(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        response_ids=torch.ones(n, width, dtype=torch.long),
        response_mask=mask,
        group_index=torch.arange(n) // group_size,
        group_size=group_size,
        truncated=torch.zeros(n, dtype=torch.bool),
        prompt_text=list(prompts) if prompts is not None else ["prompt"] * n,
        response_text=list(texts),
        metadata=list(metadata) if metadata is not None else [{} for _ in texts],
    )


class ScriptedTextPolicy(Policy):
    """Answers each prompt with the texts listed in its metadata (`responses`), cycling; trainable logits.

    Tokens are characters (code point mod `vocab`); log-probs come from one learnable logit vector,
    so the trainer has something to differentiate and step.
    """

    def __init__(self, vocab: int = 128) -> None:
        super().__init__()
        self.vocab = vocab
        self.logits = nn.Parameter(torch.zeros(vocab))
        self.last_generation_stats = {}

    def sample(self, batch, n, sampling):
        texts, metadata, prompts = [], [], []
        for prompt, meta in zip(batch["prompt"], batch["metadata"], strict=True):
            responses = meta["responses"]
            for j in range(n):
                texts.append(responses[j % len(responses)])
                metadata.append(dict(meta))
                prompts.append(str(prompt))
        rollout = make_rollout(texts, metadata, group_size=n, prompts=prompts)
        width = rollout.response_ids.shape[1]
        ids = [[ord(c) % self.vocab for c in t[:width]] + [0] * (width - len(t[:width])) for t in texts]
        rollout.response_ids = torch.tensor(ids, dtype=torch.long)
        return rollout

    def token_log_probs(self, rollout, temperature=1.0, with_entropy=False, entropy_grad=True):
        log_probs = torch.log_softmax(self.logits / temperature, -1)
        token = log_probs[rollout.response_ids] * rollout.response_mask
        entropy = None
        if with_entropy:
            entropy = -(log_probs.exp() * log_probs).sum().expand_as(token) * rollout.response_mask
        return token, entropy


class ExamplesTask(Task):
    def __init__(self, train, val=None):
        self.train, self.val = train, val

    def train_dataset(self):
        return ListDataset(self.train)

    def val_dataset(self):
        return ListDataset(self.val) if self.val else None


class Recorder(pl.Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def run_trainer(module, callbacks, train, val=None, batch_size=2, steps=1, **kwargs):
    pl.seed_everything(0)
    recorder = Recorder()
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=steps,
        limit_val_batches=1 if val else 0,
        num_sanity_val_steps=0,
        logger=kwargs.pop("logger", False),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, recorder],
        **kwargs,
    )
    data = RLVRDataModule(ExamplesTask(train, val), batch_size=batch_size, val_batch_size=len(val) if val else None)
    trainer.fit(module, data)
    return trainer, recorder


# ----------------------------------------------------------------------------- scoring


@pytest.fixture(scope="module")
def reward():
    r = MathAccuracyReward(timeout_s=2.0, workers=1)
    yield r
    r.close()


def test_scores_extracted_answers_against_the_ground_truth(reward):
    texts = [
        r"so the sum is \boxed{68}",
        r"\boxed{67}",
        "The answer is 68.",  # default methods accept "the answer is"
        r"\boxed{\frac{1}{2}}",
        "no answer",
        "",
        r"<answer> 1,000 </answer>",
    ]
    golds = ["68", "68", "68", "0.5", "68", "68", 1000]  # a non-string gold is compared as a string
    rollout = make_rollout(texts, [{"answer": g} for g in golds])
    scores = reward(rollout)
    assert scores.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert reward.is_correct(rollout, scores).tolist() == [True, False, True, True, False, False, True]
    assert reward.pop_errors() == 0


def test_methods_restrict_what_counts_as_an_answer():
    boxed_only = MathAccuracyReward(methods=["boxed"])
    rollout = make_rollout(["The answer is 68.", r"... \boxed{68}"], [{"answer": "68"}] * 2)
    try:
        assert boxed_only(rollout).tolist() == [0.0, 1.0]
    finally:
        boxed_only.close()
    with pytest.raises(ValueError, match="unknown extraction method"):
        MathAccuracyReward(methods=["boxd"])


def test_numeric_only_closes_the_boxed_expression_hack():
    # Seen in the SmolLM2 arithmetic run: the policy learned to box the question instead of the sum.
    texts = [
        r"63 + 53 = \boxed{63 + 53}",
        r"\boxed{116}",
        r"\boxed{1,16}",
        r"\boxed{\$116}",
        r"\boxed{232/2}",
        r"\boxed{116.0}",
    ]
    rollout = make_rollout(texts, [{"answer": "116"}] * len(texts))
    lenient = MathAccuracyReward(methods=["boxed"])
    strict = MathAccuracyReward(methods=["boxed"], numeric_only=True)
    try:
        assert lenient(rollout).tolist()[0] == 1.0  # mathematically equal indeed
        assert strict(rollout).tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
        assert strict.extract_answers(rollout) == [None, "116", None, "116", None, "116.0"]
        assert strict.pop_errors() == 0
    finally:
        lenient.close()
        strict.close()


def test_answer_key_and_missing_key():
    reward = MathAccuracyReward(answer_key="target")
    try:
        assert reward(make_rollout([r"\boxed{3}"], [{"target": "3"}])).tolist() == [1.0]
        assert reward(make_rollout([r"\boxed{3}", "x"], [{"answer": "3"}] * 2)).tolist() == [0.0, 0.0]
        assert reward.pop_errors() == 2  # configuration error: the whole batch scores 0 and is counted
        strict = MathAccuracyReward(answer_key="target", on_error="raise")
        with pytest.raises(KeyError, match="no metadata key 'target'"):
            strict(make_rollout([r"\boxed{3}"], [{"answer": "3"}]))
    finally:
        reward.close()


def test_extract_answers_are_normalised():
    reward = MathAccuracyReward()
    rollout = make_rollout([r"\boxed{1,000}", "nothing", r"The answer is $5$.", r"\boxed{ 2 + x }"])
    assert reward.extract_answers(rollout) == ["1000", None, "5", "2+x"]
    assert reward._verifier is None  # extraction needs no worker processes


def test_verifier_is_lazy_closed_by_teardown_and_not_copied():
    reward = MathAccuracyReward(workers=1, string_fast_path=False)
    assert reward._verifier is None  # construction (and --print_config) starts nothing
    assert reward(make_rollout([r"\boxed{2/4}"], [{"answer": "0.5"}])).tolist() == [1.0]
    pids = reward.verifier.worker_pids()
    assert len(pids) == 1
    assert copy.deepcopy(reward)._verifier is None and pickle.loads(pickle.dumps(reward))._verifier is None
    reward.teardown(None, None, "fit")
    assert reward._verifier is None
    for pid in pids:
        with pytest.raises(ChildProcessError):
            import os

            os.waitpid(pid, 0)  # already reaped
    # usable again after a teardown (a new pool starts)
    assert reward(make_rollout([r"\boxed{3/6}"], [{"answer": "0.5"}])).tolist() == [1.0]
    reward.on_exception(None, None, RuntimeError("x"))
    assert reward._verifier is None


def test_hostile_row_costs_only_its_row(reward):
    texts = [HOSTILE, r"\boxed{4}", r"\boxed{" + "{" * 5000 + "}" * 5000 + "}", r"\boxed{0.25}"]
    rollout = make_rollout(texts, [{"answer": a} for a in ["5", "4", "1", "1/4"]])
    assert reward(rollout).tolist() == [0.0, 1.0, 0.0, 1.0]
    assert reward.pop_errors() == 1


# ----------------------------------------------------------------------------- inside a Trainer run


def test_hostile_completion_in_a_training_run_costs_only_that_row(in_tmp_dir):
    from rlvr_lightning.modules import RLVRModule

    torch.manual_seed(0)
    examples = [
        {"prompt": "What is 2 + 2?", "answer": "4", "responses": [r"\boxed{4}", HOSTILE, r"\boxed{5}", r"\boxed{4}"]},
        {
            "prompt": "What is 1/2?",
            "answer": r"\frac{1}{2}",
            "responses": [r"\boxed{0.5}", "no idea", r"\boxed{2/4}", "x"],
        },
    ]
    reward = MathAccuracyReward(timeout_s=1.0, workers=2, string_fast_path=False)
    module = RLVRModule(ScriptedTextPolicy(), group_size=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    before = module.policy.logits.detach().clone()
    trainer, recorder = run_trainer(module, [reward], examples * 2, batch_size=2, steps=2)
    assert len(recorder.steps) == 2  # the run went on after the hostile row
    for step in recorder.steps:
        assert step["train/reward_errors/math_accuracy"] == 1.0  # the hostile row, every step
        assert step["train/rewards/math_accuracy"] == pytest.approx(4 / 8)  # the other rows as usual
    assert not torch.equal(module.policy.logits.detach(), before)  # and the policy was updated
    assert reward._verifier is None  # teardown stopped the workers
