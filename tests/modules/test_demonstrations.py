"""`demonstrations: {per_group, key, template}`, LUFFY's mixed-policy groups (arXiv:2504.14945): the rows added by
hand (toy and language-model policies), their rewards and advantages over the whole group in a fit, the loss told
which rows they are, dynamic sampling's top-ups, retired prompts counted without them, and refusals that name the
option."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.advantages import CenteredAdvantage
from rlvr_lightning.core import LUFFY
from rlvr_lightning.data import InlineTask, RLVRDataModule, SortTask
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import PPOModule, RLVRModule
from rlvr_lightning.modules.demonstrations import DemonstrationConfig, add_demonstrations
from rlvr_lightning.modules.group_filter import GroupFilterConfig
from rlvr_lightning.modules.options import DynamicSamplingConfig, ImportanceSamplingConfig, ReplayConfig
from rlvr_lightning.policies.hf import HFPolicy
from rlvr_lightning.policies.hf_options import HFModelOptions, PromptOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward
from rlvr_lightning.runtime.option_domains import OptionValueError
from tests.data.test_retire_solved import PROMPTS, SOLVED, G, TablePolicy
from tests.rewards.test_math_reward import Recorder

ONE = DemonstrationConfig(per_group=1, key="answer")


def toy(seed=0):
    torch.manual_seed(seed)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8, activation="tanh")


class LoggedLUFFY(LUFFY):
    """LUFFY that keeps the `demonstration_rows` the update hands it."""

    def __init__(self):
        super().__init__()
        self.handed = []

    def __call__(self, log_probs, old_log_probs, advantages, mask, demonstration_rows=None):
        self.handed.append(demonstration_rows)
        return super().__call__(log_probs, old_log_probs, advantages, mask, demonstration_rows=demonstration_rows)


def fit(module, steps=2, batch_size=4, callbacks=(), reward=None, advantage=None):
    """`advantage`: the AdvantageCallback (None: Dr. GRPO's centred one; False: none, for PPOModule)."""
    pl.seed_everything(0)
    metrics = Recorder()
    advantages = [] if advantage is False else [advantage or CenteredAdvantage()]
    trainer = pl.Trainer(
        max_epochs=1, limit_train_batches=steps, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[reward or SortInclusionOrderingReward(), *advantages, metrics, *callbacks],
    )  # fmt: skip
    trainer.fit(module, RLVRDataModule(SortTask(vocab_size=5, length=3, num_val=0), batch_size=batch_size))
    return metrics.steps


def test_the_demonstration_ends_each_group_of_a_toy_rollout():
    policy = toy()
    batch = {"prompt": [[3, 0, 2], [4, 4, 1]], "metadata": [{"answer": [0, 2, 3]}, {"answer": [1, 4, 4]}]}
    sampled = policy.sample(batch, 3, SamplingConfig())
    mixed = add_demonstrations(policy, sampled, DemonstrationConfig(per_group=2, key="answer"))
    assert mixed.num_rows == 10 and mixed.group_size == 5
    assert mixed.group_index.tolist() == [0] * 5 + [1] * 5
    assert mixed.demonstration_rows.tolist() == ([False] * 3 + [True] * 2) * 2
    assert torch.equal(mixed.response_ids[[0, 1, 2, 5, 6, 7]], sampled.response_ids)
    assert mixed.response_ids[[3, 4, 8, 9]].tolist() == [[0, 2, 3], [0, 2, 3], [1, 4, 4], [1, 4, 4]]
    assert mixed.prompt_ids[:5].tolist() == [[3, 0, 2]] * 5 and mixed.prompt_ids[5:].tolist() == [[4, 4, 1]] * 5
    assert mixed.response_mask.sum().item() == 30 and not mixed.truncated.any()
    assert mixed.old_log_probs is None  # the sampler's log-probs say nothing of a demonstration
    assert [m["answer"] for m in mixed.metadata] == [[0, 2, 3]] * 5 + [[1, 4, 4]] * 5


def test_several_demonstrations_of_a_prompt_fill_its_rows_in_turn():
    policy = toy()
    several = [[0, 2, 3], [3, 2, 0]]  # token-id lists: two demonstrations (a list of ints would be one)
    batch = {"prompt": [[3, 0, 2], [1, 1, 1]], "metadata": [{"shown": several}, {"shown": [1, 1, 1]}]}
    sampled = policy.sample(batch, 2, SamplingConfig())
    mixed = add_demonstrations(policy, sampled, DemonstrationConfig(per_group=3, key="shown"))
    assert mixed.group_size == 5 and mixed.demonstration_rows.tolist() == ([False] * 2 + [True] * 3) * 2
    assert mixed.response_ids[2:5].tolist() == [[0, 2, 3], [3, 2, 0], [0, 2, 3]]
    assert mixed.response_ids[7:10].tolist() == [[1, 1, 1]] * 3
    assert mixed.group_index.tolist() == [0] * 5 + [1] * 5 and mixed.prompt_ids[5:].tolist() == [[1, 1, 1]] * 5
    with pytest.raises(ValueError, match="prompt 1 of the batch has no demonstration"):
        add_demonstrations(
            policy,
            policy.sample({"prompt": batch["prompt"], "metadata": [{"shown": several}, {"shown": [[1, 1, 1], []]}]}, 2,
                          SamplingConfig()),
            DemonstrationConfig(per_group=1, key="shown"),
        )  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


def test_a_text_demonstration_is_tokenised_with_eos_and_keeps_its_groups_prompt(tokenizer_dir):
    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        prompt=PromptOptions(template="chat"),
    )
    batch = {"prompt": ["What is 2+3?", "Say ab."], "metadata": [{"answer": "5"}, {"answer": "ab"}]}
    sampled = policy.sample(batch, 2, SamplingConfig(max_new_tokens=4))
    config = DemonstrationConfig(per_group=1, template="The answer is \\boxed{{{answer}}}.")
    mixed = add_demonstrations(policy, sampled, config)
    assert (
        mixed.response_text[2] == "The answer is \\boxed{5}." and mixed.response_text[5] == "The answer is \\boxed{ab}."
    )
    ids = policy.tokenizer("The answer is \\boxed{5}.", add_special_tokens=False)["input_ids"]
    assert mixed.response_ids[2, : len(ids) + 1].tolist() == ids + [policy.eos_token_ids[0]]
    assert mixed.response_mask[2].sum().item() == len(ids) + 1
    for group, rows in ((0, [0, 1, 2]), (1, [3, 4, 5])):
        assert all(torch.equal(mixed.prompt_ids[r], mixed.prompt_ids[rows[0]]) for r in rows)
        assert {mixed.prompt_text[r] for r in rows} == {sampled.prompt_text[2 * group]}
        assert [mixed.prompts[r] for r in rows] == [batch["prompt"][group]] * 3
    assert torch.equal(mixed.response_ids[[0, 1, 3, 4], : sampled.response_ids.shape[1]], sampled.response_ids)
    assert mixed.sampling_log_probs is None


def test_a_demonstration_over_the_budget_is_cut_and_marked_truncated(tokenizer_dir):
    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        prompt=PromptOptions(template="chat"),
    )
    batch = {"prompt": ["What is 2+3?"], "metadata": [{"long": "The answer is five.", "short": "5"}]}
    sampled = policy.sample(batch, 2, SamplingConfig(max_new_tokens=4))
    with pytest.warns(UserWarning, match="longer than sampling.max_new_tokens=4 are cut"):
        mixed = add_demonstrations(policy, sampled, DemonstrationConfig(per_group=1, key="long"), max_tokens=4)
    ids = policy.tokenizer("The answer is five.", add_special_tokens=False)["input_ids"]
    assert len(ids) > 4 and mixed.response_ids[2, :4].tolist() == ids[:4] and mixed.response_mask[2].sum() == 4
    assert mixed.truncated[2] and mixed.response_text[2] == policy.tokenizer.decode(ids[:4], skip_special_tokens=True)
    fits = add_demonstrations(policy, sampled, DemonstrationConfig(per_group=1, key="short"), max_tokens=4)
    assert not fits.truncated[2] and fits.response_text[2] == "5"


def test_a_fit_scores_the_demonstrations_and_trains_them_as_such():
    loss = LoggedLUFFY()
    module = RLVRModule(toy(), group_size=4, loss=loss, demonstrations=ONE)
    steps = fit(module)
    rollout = module.last_rollout
    assert rollout.num_rows == 16 and rollout.demonstration_rows.tolist() == [False, False, False, True] * 4
    assert (rollout.reward[rollout.demonstration_rows] == 5.0).all()  # a sorted response: 3 included + 2 ordered
    groups = rollout.reward.view(4, 4)
    assert rollout.advantages.tolist() == pytest.approx((groups - groups.mean(-1, keepdim=True)).flatten().tolist())
    assert torch.equal(loss.handed[-1], rollout.demonstration_rows)
    last = steps[-1]
    assert last["train/demonstrations/reward_mean"] == 5.0
    assert last["train/demonstrations/truncated_frac"] == 0.0
    sampled = rollout.reward[~rollout.demonstration_rows].mean().item()
    assert last["train/demonstrations/sampled_reward_mean"] == pytest.approx(sampled)
    assert 0.0 < last["train/demonstration_prob"] < 1.0


class FlatFirstRound(SortInclusionOrderingReward):
    """Scores every row of the first generation round 0 (each group agrees: dynamic sampling drops them all), then
    as its parent."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def score(self, rollout):
        self.calls += 1
        return torch.zeros(rollout.num_rows) if self.calls == 1 else super().score(rollout)


def test_dynamic_sampling_tops_up_with_demonstrations_too():
    module = RLVRModule(
        toy(), group_size=3, loss="luffy", demonstrations=ONE, dynamic_sampling=DynamicSamplingConfig(enabled=True)
    )
    steps = fit(module, steps=1, batch_size=8, reward=FlatFirstRound())
    rollout = module.last_rollout
    assert steps[-1]["train/dynamic_sampling/rounds"] >= 2  # every trained group is a top-up's
    assert rollout.num_rows == 24 and rollout.demonstration_rows.tolist() == [False, False, True] * 8
    prompts = rollout.prompt_ids[rollout.demonstration_rows]
    assert torch.equal(rollout.response_ids[rollout.demonstration_rows], prompts.sort(-1).values)
    assert (rollout.reward.view(8, 3).std(-1) > 0).all()


def test_a_demonstration_is_not_counted_as_a_solve(tmp_path):
    """Prompt 2 is solved by 8 of its 10 sampled responses: under retire_solved 0.81 it stays, though with its
    demonstration 9 of 11 rows are right."""
    pl.seed_everything(0)
    torch.manual_seed(0)
    module = RLVRModule(TablePolicy(vocab_size=5, prompt_length=3, embedding_dim=4), group_size=G + 1, loss="luffy",
                        demonstrations=ONE)  # fmt: skip
    data = RLVRDataModule(InlineTask([{"prompt": p, "answer": sorted(p)} for p in PROMPTS], repeat=False),
                          batch_size=2, retire_solved=0.81)  # fmt: skip
    trainer = pl.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[SortInclusionOrderingReward()],
    )  # fmt: skip
    trainer.fit(module, data)
    assert set(data.retirement.retired) == SOLVED


@pytest.mark.parametrize(
    "options, message",
    [
        ({"demonstrations": DemonstrationConfig(per_group=4)}, "per_group=4 must be below group_size=4"),
        ({"demonstrations": ONE, "loss": "ppo_clip"}, "loss PPOClip would train as sampled responses; use loss: luffy"),
        ({"group_filter": GroupFilterConfig(keep=2)}, "cannot be combined with group_filter.keep"),
        ({"replay": ReplayConfig(size=8)}, "cannot be combined with replay.size"),
        ({"rollout_is": ImportanceSamplingConfig(mode="token_truncate")}, "cannot be combined with rollout_is.mode"),
        ({"rollout_staleness": 1}, "cannot be combined with rollout_staleness"),
    ],
)
def test_what_cannot_be_combined_is_refused_by_name(options, message):
    options = {"loss": "luffy", "demonstrations": ONE, **options}
    with pytest.raises(ValueError, match=message):
        RLVRModule(toy(), group_size=4, **options)


def test_a_missing_demonstration_names_the_field_and_what_the_prompt_has():
    policy = toy()
    metadata = [{"answer": [1, 2, 3], "long": [1, 2, 3, 4]}]
    sampled = policy.sample({"prompt": [[1, 2, 3]], "metadata": metadata}, 2, SamplingConfig())
    with pytest.raises(ValueError, match=r"demonstrations.key='solution': prompt 0 .* fields: answer, long\)"):
        add_demonstrations(policy, sampled, DemonstrationConfig(per_group=1))
    with pytest.raises(ValueError, match=r"template='\{question\}' names 'question', .* fields: answer, long\)"):
        add_demonstrations(policy, sampled, DemonstrationConfig(per_group=1, template="{question}"))
    with pytest.raises(ValueError, match="response_length=3, but the demonstration of prompt 0 .* 4 tokens"):
        add_demonstrations(policy, sampled, DemonstrationConfig(per_group=1, key="long"))
    with pytest.raises(OptionValueError, match="demonstrations.per_group"):
        DemonstrationConfig(per_group=-1)


def test_ppo_module_trains_with_demonstrations_and_its_critic_scores_them():
    module = PPOModule(toy(), group_size=4, loss="luffy", demonstrations=ONE)
    steps = fit(module, advantage=False)
    rollout = module.last_rollout
    assert rollout.demonstration_rows.tolist() == [False, False, False, True] * 4
    assert rollout.values is not None and rollout.values[rollout.demonstration_rows].abs().sum() > 0
    assert steps[-1]["train/demonstrations/reward_mean"] == 5.0
