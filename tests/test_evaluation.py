"""PassAtK, MajorityVoteAccuracy and ValidationMetrics, hand-computed; and the proposed validation_step wiring."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlvr_lightning.evaluation.metrics import MajorityVoteAccuracy, PassAtK, ValidationMetrics, majority_vote
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import ValidationConfig
from rlvr_lightning.rewards.format import BoxedFormatReward
from rlvr_lightning.rewards.math import MathAccuracyReward
from tests.rewards.test_math_reward import ScriptedTextPolicy, make_rollout, run_trainer


def test_pass_at_k_by_hand():
    # n = 4 samples per prompt, correct counts 0, 1, 2, 4; pass@2 = 1 - C(n-c, 2) / C(4, 2)
    #   c=0: 0;  c=1: 1 - 3/6 = 1/2;  c=2: 1 - 1/6 = 5/6;  c=4: 1   -> mean 7/12
    correct = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    metric = PassAtK(k=2)
    metric.update(correct[:8], group_size=4)  # two updates accumulate per prompt
    metric.update(correct[8:], group_size=4)
    assert metric.compute().item() == pytest.approx(7 / 12)
    one = PassAtK(k=1)
    one.update(correct, group_size=4)
    assert one.compute().item() == pytest.approx(correct.float().mean().item())  # pass@1 = accuracy
    four = PassAtK(k=4)
    four.update(correct, group_size=4)
    assert four.compute().item() == pytest.approx(3 / 4)  # any correct
    with pytest.raises(ValueError, match="at least 4 samples"):
        PassAtK(k=4).update(correct, group_size=2)
    with pytest.raises(ValueError, match="whole groups"):
        PassAtK(k=1).update(correct[:3], group_size=2)


@pytest.mark.parametrize(
    "answers, winner",
    [
        (["1", "2", "2", "1"], "1"),  # tie: the first seen
        ([None, "3", "2", "3"], "3"),
        ([None, None], None),
        (["5"], "5"),
    ],
)
def test_majority_vote(answers, winner):
    assert majority_vote(answers) == winner


@pytest.mark.parametrize(
    "answers, weights, winner",
    [
        (["1", "2", "2", "1"], [0.9, 0.3, 0.4, 0.0], "1"),  # 0.9 against 0.7: one confident vote beats two
        (["1", "2", "2"], [0.9, 0.5, 0.5], "2"),  # 1.0 against 0.9
        (["1", "2"], [0.5, 0.5], "1"),  # tie: the first seen
        ([None, "3"], [1.0, 0.0], "3"),  # no answer, no vote, whatever its weight
        ([None, None], [1.0, 1.0], None),
    ],
)
def test_confidence_weighted_majority_vote(answers, weights, winner):
    assert majority_vote(answers, weights) == winner


def test_majority_vote_accuracy_by_hand():
    answers = [
        "4",
        "4",
        "5",
        None,  # prompt 0: majority 4, the 4s are correct -> solved
        "7",
        "8",
        "8",
        "9",  # prompt 1: majority 8, wrong (only 7 is correct) -> not solved
        None,
        None,
        None,
        None,  # prompt 2: no answers -> wrong
        "1",
        "2",
        "2",
        "1",  # prompt 3: tie 1/2 -> "1" (first seen), correct -> solved
    ]
    correct = torch.tensor([1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1], dtype=torch.bool)
    metric = MajorityVoteAccuracy()
    metric.update(answers, correct, group_size=4)
    assert metric.compute().item() == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="answers"):
        metric.update(answers[:3], correct, group_size=4)


def test_response_length_of_multi_turn_responses_counts_observations():
    from rlvr_lightning.rollout import TokenSource

    rollout = make_rollout(["a", "b"], group_size=2, lengths=[4, 4])
    S, T = TokenSource.SAMPLED, TokenSource.TOOL
    rollout.response_source = torch.tensor([[S, T, T, S], [S, S, 0, 0]])
    rollout.response_mask = (rollout.response_source == S).float()
    metrics = ValidationMetrics(group_size=2)
    metrics.update(rollout)
    assert metrics.compute()["response_length"].item() == 3.0  # (4 + 2) / 2; the sampled tokens alone give 2


def test_validation_metrics_by_hand():
    texts = ["a", "bb", "ccc", "dddd"]
    rollout = make_rollout(texts, group_size=2, lengths=[1, 2, 3, 4])
    metrics = ValidationMetrics(group_size=2, ks=[1, 2])
    assert metrics.compute() == {}
    correct = torch.tensor([True, False, False, False])
    metrics.update(rollout, correct, ["1", "2", "3", "3"], torch.tensor([True, True, False, True]))
    out = {k: round(v.item(), 6) for k, v in metrics.compute().items()}
    assert out == {
        "accuracy": 0.25,
        "pass@1": 0.25,
        "pass@2": 0.5,  # prompt 0: 1 of 2 correct -> 1; prompt 1: 0
        "majority_vote_accuracy": 0.5,  # prompt 0: tie -> "1" correct; prompt 1: "3" wrong
        "format_rate": 0.75,
        "response_length": 2.5,
    }
    metrics.reset()
    metrics.update(rollout)  # only lengths: the other metrics had no data and are left out
    assert set(metrics.compute()) == {"response_length"}
    metrics.update(rollout, correct)  # no answers: no majority vote
    assert set(metrics.compute()) == {"accuracy", "pass@1", "pass@2", "response_length"}
    with pytest.raises(ValueError, match="group_size"):
        ValidationMetrics(group_size=2, ks=[4])
    assert set(ValidationMetrics(group_size=3)._metrics()) >= {"pass@3"}


# ----------------------------------------------------------------------------- the proposed module wiring


class EvaluatingModule(RLVRModule):
    """RLVRModule with the validation lines of `RLVRModule.validation_step`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.val_metrics = ValidationMetrics(group_size=self.validation.group_size)

    def validation_step(self, batch, batch_idx):
        sampling = dataclasses.replace(self.sampling, do_sample=not self.validation.greedy)
        rollout = self.policy.sample(batch, self.validation.group_size, sampling)
        self.score(rollout)
        self.log("val/reward_mean", rollout.reward.mean(), on_epoch=True, batch_size=rollout.num_rows)
        correct = self.correctness(rollout)
        format_ok = self.correctness(rollout, kind="format")
        answers = next(
            (a for cb in self.reward_callbacks if cb.kind == "task" and (a := cb.extract_answers(rollout)) is not None),
            None,
        )
        self.val_metrics.update(rollout, correct, answers, format_ok)

    def on_validation_epoch_end(self):
        self.log_dict({f"val/{k}": v for k, v in self.val_metrics.compute().items()})
        self.val_metrics.reset()


def test_validation_wiring_logs_every_metric(in_tmp_dir):
    responses = [r"\boxed{4}", r"\boxed{5}", "4", r"\boxed{4}"]  # per prompt: 2 of 4 correct, 3 boxed
    val = [{"prompt": f"p{i}", "answer": "4", "responses": responses} for i in range(2)]
    train = [{"prompt": "t", "answer": "4", "responses": responses}] * 2
    module = EvaluatingModule(
        ScriptedTextPolicy(), group_size=4, validation=ValidationConfig(group_size=4, greedy=False)
    )
    rewards = [MathAccuracyReward(methods=["boxed"]), BoxedFormatReward(weight=0.5)]
    trainer, _ = run_trainer(module, rewards, train, val=val, batch_size=2, steps=1, val_check_interval=1)
    metrics = {k: round(float(v), 6) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    assert metrics == {
        "val/reward_mean": round((2 * 1.5 + 1 * 0.5) / 4, 6),
        "val/accuracy": 0.5,
        "val/pass@4": 1.0,
        "val/majority_vote_accuracy": 1.0,  # boxed answers 4, 5, 4: majority "4"
        "val/format_rate": 0.75,
        "val/response_length": round(sum(len(r) for r in responses) / 4, 6),
    }


def test_the_validation_logs_each_pass_at_k_asked_for(in_tmp_dir):
    responses = [r"\boxed{4}", r"\boxed{5}", "4", r"\boxed{4}"]  # per prompt: 2 of 4 correct
    val = [{"prompt": f"p{i}", "answer": "4", "responses": responses} for i in range(2)]
    train = [{"prompt": "t", "answer": "4", "responses": responses}] * 2
    validation = ValidationConfig(group_size=4, greedy=False, pass_at_k=[1, 2, 4])
    module = RLVRModule(ScriptedTextPolicy(), group_size=4, validation=validation)
    trainer, _ = run_trainer(
        module, [MathAccuracyReward(methods=["boxed"])], train, val=val, batch_size=2, steps=1, val_check_interval=1
    )
    metrics = {k: round(float(v), 6) for k, v in trainer.callback_metrics.items() if k.startswith("val/pass@")}
    # pass@k = 1 - C(2, k) / C(4, k) with 2 wrong of 4: 1 - 2/4, 1 - 1/6, 1
    assert metrics == {"val/pass@1": 0.5, "val/pass@2": round(5 / 6, 6), "val/pass@4": 1.0}
    for bad in ([5], [], [0]):
        with pytest.raises(
            ValueError, match=r"validation.pass_at_k=.* each k must be in \[1, validation.group_size=4\]"
        ):
            ValidationConfig(group_size=4, greedy=False, pass_at_k=bad)
