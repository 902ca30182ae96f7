"""SDPO's `SelfTeacher` (modules/self_distillation.py) on a tiny random Llama: the re-prompts, the teacher's
log-probs, the rows it teaches, the loss against TRL's `SDPOTrainer` formula, the EMA and base copies, and the
refusals."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.policy_losses import PPOClip
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.generation.loop import left_pad
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule, SelfTeacher
from rlvr_lightning.modules.distillation import DistillationConfig, make_teacher
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, KLConfig, UpdateConfig
from rlvr_lightning.modules.scoring import score
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.policies.hf import HFPolicy
from rlvr_lightning.policies.hf_options import HFModelOptions, LoRAOptions, PromptOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_domains import OptionValueError

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["What is 2+3?", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say ab."}]]
REWARD = [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # prompt 0: rows 1 and 3 succeed; prompt 1: none


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


def policy_of(tokenizer_dir, seed: int = 0, **groups) -> HFPolicy:
    torch.manual_seed(seed)
    model = HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir))
    return HFPolicy(model=model, prompt=PromptOptions(template="chat"), **groups)


def rollout_of(policy):
    torch.manual_seed(1)
    rollout = policy.sample({"prompt": PROMPTS}, 4, SamplingConfig(max_new_tokens=5))
    rollout.reward = torch.tensor(REWARD)
    rollout.advantages = torch.zeros(rollout.num_rows)
    return rollout


def whole(rollout, score):
    return score(rollout)


def test_the_teacher_scores_each_taught_row_behind_its_hand_built_re_prompt(tokenizer_dir):
    policy = policy_of(tokenizer_dir)
    rollout = rollout_of(policy)
    teacher = SelfTeacher(weights="live").bind(policy)
    teacher.score(rollout, whole, 1.0)

    assert rollout.teacher_rows.tolist() == [True, True, True, True, False, False, False, False]
    # an untaught row is scored behind its own prompt (every rank scores every row), and masked in the loss
    own_rows, _ = policy.token_log_probs(rollout.select(torch.arange(4, 8)))
    mask = rollout.response_mask[4:].bool()
    assert_close(rollout.teacher_log_probs[4:][mask], own_rows.detach()[mask], rtol=1e-5, atol=1e-6)
    demos = [1, 3, 1, 1]  # row 1 skips itself for row 3
    tail = "\n\nCorrectly solve the original question.\n"
    texts = [
        f"<|user|>What is 2+3?\nCorrect solution:\n\n{rollout.response_text[d]}\n\n{tail}<|endoftext|><|assistant|>"
        for d in demos
    ]
    ids = [policy.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    prompt_ids, prompt_mask = left_pad(ids, policy.pad_token_id)
    by_hand = rollout.select(torch.arange(4))
    by_hand.prompt_ids, by_hand.prompt_mask = prompt_ids, prompt_mask
    by_hand.group_index, by_hand.group_size = torch.arange(4), 1
    expected, _ = policy.token_log_probs(by_hand)
    mask = rollout.response_mask[:4].bool()
    assert_close(rollout.teacher_log_probs[:4][mask], expected.detach()[mask], rtol=1e-5, atol=1e-6)
    own, _ = policy.token_log_probs(rollout.select(torch.arange(4)))
    assert not torch.allclose(own.detach()[mask], expected.detach()[mask])  # the re-prompt changes the prediction


def test_a_chat_prompt_keeps_its_system_message_and_re_writes_its_last_user_message():
    teacher = SelfTeacher(solution_template="[{successful_previous_attempt}]", reprompt_template="{prompt}{solution}!")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say {solution}."}]
    assert teacher.reprompt(messages, "ab") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say {solution}.[ab]!"},  # a placeholder in the prompt is left as it is
    ]
    assert messages[1]["content"] == "Say {solution}."  # the data's prompt is not modified
    stripping = SelfTeacher(solution_template="<{successful_previous_attempt}>", strip_thinking=True)
    assert stripping.reprompt("Q", "<think>long\nthought</think> 5").startswith("Q<5>")


def test_the_update_follows_trls_sampled_token_sdpo_loss(tokenizer_dir):
    """TRL trl/experimental/sdpo: per-token (log p - log q).detach() * log p on the sampled tokens, masked to the
    rows with a demonstration, averaged over each row's tokens then over rows (first update: its IS ratio is 1)."""
    policy = policy_of(tokenizer_dir)
    rollout = rollout_of(policy)
    update = PolicyUpdate(
        policy, PPOClip(), AggregationConfig(mode="seq-mean-token-mean"), KLConfig(), None,
        ImportanceSamplingConfig(), UpdateConfig(), 0.0, SamplingConfig(),
        teacher=make_teacher(SelfTeacher(weights="live"), policy), distillation=DistillationConfig(rl_coef=0.0),
    )  # fmt: skip
    update.add_old_and_reference_log_probs(rollout)
    mask = rollout.response_mask.bool()
    sizes = MiniBatchSizes(rollout.num_rows, int(mask.sum()))
    policy.zero_grad(set_to_none=True)
    update.micro_batch_loss(rollout, mask, sizes, True, True).loss.backward()
    ours = [p.grad.clone() for p in policy.parameters() if p.grad is not None]

    policy.zero_grad(set_to_none=True)
    log_p, _ = policy.token_log_probs(rollout)
    loss_mask = mask.float() * rollout.teacher_rows.float().unsqueeze(-1)
    per_token = (log_p - rollout.teacher_log_probs).detach() * log_p
    trl = ((per_token * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1.0)).mean()
    trl.backward()
    theirs = [p.grad.clone() for p in policy.parameters() if p.grad is not None]
    assert len(ours) == len(theirs) and any(g.abs().sum() > 0 for g in ours)
    for mine, reference in zip(ours, theirs, strict=True):
        assert_close(mine, reference, rtol=1e-5, atol=1e-7)


def test_the_ema_copy_moves_toward_the_policy_before_each_scoring_and_base_stays(tokenizer_dir):
    policy = policy_of(tokenizer_dir)
    ema, base = SelfTeacher(weights="ema", ema_rate=0.25).bind(policy), SelfTeacher(weights="base").bind(policy)
    initial = [p.detach().clone() for p in policy.parameters()]
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    rollout = rollout_of(policy)
    ema.score(rollout, whole, 1.0)
    base.score(rollout, whole, 1.0)
    for before, trained, moved, kept in zip(
        initial, policy.parameters(), ema.copy.parameters(), base.copy.parameters(), strict=True
    ):
        assert_close(moved, 0.75 * before + 0.25 * trained.detach())  # teacher <- (1 - rate) teacher + rate policy
        assert torch.equal(kept, before)


def test_the_copy_is_checkpointed_with_the_module_and_is_not_trained(tokenizer_dir):
    policy = policy_of(tokenizer_dir)
    module = RLVRModule(policy=policy, teacher=SelfTeacher(weights="ema"), distillation=DistillationConfig(rl_coef=0))
    keys = module.state_dict().keys()
    copied = [key for key in keys if key.startswith("teacher.copy.")]
    assert len(copied) == len(policy.state_dict())
    trained = {id(p) for p in module.optimized_parameters()}
    assert not any(id(p) in trained for p in module.teacher.parameters())
    live = RLVRModule(policy=policy_of(tokenizer_dir), teacher=SelfTeacher(weights="live"))
    assert not any(key.startswith("teacher") for key in live.state_dict())  # the policy is not stored twice


def test_refusals_name_the_option(tokenizer_dir):
    with pytest.raises(OptionValueError, match="weights='newest'.*choose one of"):
        SelfTeacher(weights="newest")
    with pytest.raises(OptionValueError, match="ema_rate=0"):
        SelfTeacher(ema_rate=0)
    with pytest.raises(
        OptionValueError, match=r"reprompt_template='\{prompt\} again'.*containing \{prompt\} and \{solution\}"
    ):
        SelfTeacher(reprompt_template="{prompt} again")
    with pytest.raises(ValueError, match="no text prompts"):
        SelfTeacher().bind(ToySortPolicy(vocab_size=5, prompt_length=3))


def test_feedback_is_shown_in_its_template_and_teaches_a_response_whose_group_has_no_success(tokenizer_dir):
    policy = policy_of(tokenizer_dir)
    rollout = rollout_of(policy)
    rollout.feedback = [None, None, "wrong answer", None, "NameError: x", None, "  ", None]
    teacher = SelfTeacher(weights="live", feedback=True).bind(policy)
    teacher.score(rollout, whole, 1.0)
    # rows 0-3 have a demonstration; row 4 only its feedback; row 6's blank feedback is none
    assert rollout.teacher_rows.tolist() == [True, True, True, True, True, False, False, False]
    shown = "\nThe following is feedback from your unsuccessful earlier attempt:\n\nNameError: x\n\n"
    reprompt = teacher.reprompt(PROMPTS[1], None, "NameError: x")
    assert reprompt[1]["content"] == f"Say ab.{shown}\n\nCorrectly solve the original question.\n"
    both = teacher.reprompt("Q", "5", "wrong answer")
    assert both.startswith("Q\nCorrect solution:\n\n5\n\n\nThe following is feedback")
    # feedback_only_without_solution: row 2's feedback is dropped (it has a demonstration), row 4's kept
    only = SelfTeacher(weights="live", feedback=True, feedback_only_without_solution=True).bind(policy)
    demos = [True] * 4 + [False] * 4  # the rows with a demonstration
    assert only.feedback_shown(rollout, demos) == [None, None, None, None, "NameError: x", None, None, None]
    assert teacher.feedback_shown(rollout, demos)[2] == "wrong answer"
    silent = SelfTeacher(weights="live").bind(policy)
    assert silent.feedback_shown(rollout, demos) == [None] * 8  # feedback is off by default
    with pytest.raises(ValueError, match="teacher.feedback=true .* has no \\{feedback\\}"):
        SelfTeacher(feedback=True, reprompt_template="{prompt}{solution}").bind(policy)


class _Says(RewardCallback):
    """A reward of 0 that says `notes[i]` of row i."""

    def __init__(self, notes, name):
        super().__init__(name=name, timeout_s=None)
        self.notes = notes

    def score(self, rollout):
        return torch.zeros(rollout.num_rows)

    def feedback(self, rollout, scores):
        return self.notes


def test_scoring_joins_what_each_reward_says_of_a_row_one_line_each():
    rollout = Rollout.from_texts(["a", "b", "c"])
    score(rollout, [_Says(["x", None, None], "one"), _Says(None, "two"), _Says(["y", "z", ""], "three")])
    assert rollout.feedback == ["x\ny", "z", None]
    quiet = Rollout.from_texts(["a"])
    score(quiet, [_Says(None, "one")])
    assert quiet.feedback is None
    joined = Rollout.concat([rollout, quiet])  # a rollout no reward spoke of joins with None rows
    assert joined.feedback == ["x\ny", "z", None, None]


def test_a_re_prompt_over_the_models_context_is_refused_naming_the_lengths(tokenizer_dir):
    policy = policy_of(tokenizer_dir)
    rollout = rollout_of(policy)
    teacher = SelfTeacher(weights="live", solution_template="{successful_previous_attempt}" + " pad" * 300)
    with pytest.raises(ValueError, match=r"take \d+ tokens, over the model's context of 256"):
        teacher.bind(policy).score(rollout, whole, 1.0)


def test_with_lora_the_ema_copy_averages_the_adapter_factors_and_base_disables_the_adapter(tokenizer_dir):
    policy = policy_of(tokenizer_dir, lora=LoRAOptions(r=2, alpha=4))
    ema, base = SelfTeacher(weights="ema", ema_rate=0.5).bind(policy), SelfTeacher(weights="base").bind(policy)
    factors = {name: p.detach().clone() for name, p in policy.named_parameters() if "lora_" in name}
    assert factors and all(p.requires_grad for name, p in policy.named_parameters() if "lora_" in name)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.add_(1.0)
    rollout = rollout_of(policy)
    ema.score(rollout, whole, 1.0)
    copied = dict(ema.copy.named_parameters())
    for name, before in factors.items():  # each factor half-way from the adapter it copied to the trained one
        assert_close(copied[name], before + 0.5)
    assert not any(p.requires_grad for p in ema.copy.parameters())
    ema_log_probs = rollout.teacher_log_probs.clone()
    base.score(rollout, whole, 1.0)  # the model with its adapter disabled: the initial weights
    assert not torch.allclose(ema_log_probs, rollout.teacher_log_probs)
    with torch.no_grad(), policy.model.disable_adapter():
        shown = [rollout.response_text[d] for d in (1, 3, 1, 1)] + [None] * 4  # rows 0-3's demonstrations
        expected = policy.token_log_probs(base.reprompted(rollout, shown, [None] * 8))[0]
    mask = rollout.response_mask.bool()
    assert_close(rollout.teacher_log_probs[mask], expected[mask], rtol=1e-5, atol=1e-6)
