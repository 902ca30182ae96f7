"""`distillation.mode: topk_logits` in the update: the divergence over the teacher's top-k by hand against a scripted
teacher, the importance-ratio clip, zero against itself, learning, SDPO's self-teacher against TRL's top-k formula
restated on a hand-built re-prompt, and the refusals."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.logit_distillation import top_k_distillation_loss
from rlvr_lightning.core.losses.policy_losses import PPOClip
from rlvr_lightning.generation.loop import left_pad
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule, SelfTeacher
from rlvr_lightning.modules.distillation import DistillationConfig, make_teacher
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, KLConfig, UpdateConfig
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.policies.sort_teacher import SortTeacher
from rlvr_lightning.rewards import SortInclusionOrderingReward
from rlvr_lightning.runtime.option_domains import OptionValueError

from .test_distillation import L, V, loss_and_grads, rollout_of, student, update_of
from .test_rlvr_module import fit
from .test_self_distillation import policy_of, tokenizer_dir  # noqa: F401 (a fixture)
from .test_self_distillation import rollout_of as sdpo_rollout_of

pytestmark = pytest.mark.usefixtures("one_thread")


def student_probabilities(policy, rollout) -> torch.Tensor:
    """`[N, T, V]` the toy student's distribution at each response position."""
    with torch.no_grad():
        return torch.softmax(policy(rollout.prompt_ids), dim=-1)


def test_a_one_token_support_with_its_tail_is_the_two_category_kl_by_hand():
    """SortTeacher (0.8 on the sorted prompt's token): its top-1 and the tail are {0.8, 0.2}; the student's are
    {p, 1 - p} with p its probability of that token. Reverse KL per token: p ln(p / 0.8) + (1 - p) ln((1 - p) / 0.2)."""
    policy = student()
    rollout = rollout_of(policy)
    update = update_of(policy, SortTeacher(V, L, confidence=0.8), rl_coef=0.0, mode="topk_logits", topk=1,
                       add_tail=True, support="teacher")  # fmt: skip
    part, _ = loss_and_grads(update, rollout)
    probs = student_probabilities(policy, rollout)
    expected = []
    for row in range(rollout.num_rows):
        target = sorted(rollout.prompt_ids[row].tolist())
        assert rollout.teacher_top_ids[row, :, 0].tolist() == target
        for t in range(L):
            p = probs[row, t, target[t]].item()
            expected.append(p * math.log(p / 0.8) + (1 - p) * math.log((1 - p) / 0.2))
    assert_close(part.loss.item(), sum(expected) / len(expected), rtol=1e-5, atol=1e-6)


def test_the_student_s_top_token_with_its_tail_is_the_two_category_kl_by_hand():
    """`support: student`: the student's most probable token y* (p) against the teacher's probability of it (0.8 if
    it is the sorted prompt's token, else 0.05): p ln(p / q) + (1 - p) ln((1 - p) / (1 - q))."""
    policy = student()
    rollout = rollout_of(policy)
    update = update_of(policy, SortTeacher(V, L, confidence=0.8), rl_coef=0.0, mode="topk_logits", topk=1,
                       add_tail=True)  # fmt: skip
    part, _ = loss_and_grads(update, rollout)
    probs = student_probabilities(policy, rollout)
    expected = []
    for row in range(rollout.num_rows):
        target = sorted(rollout.prompt_ids[row].tolist())
        best = probs[row].argmax(-1).tolist()
        assert rollout.teacher_top_ids[row, :, 0].tolist() == best
        for t in range(L):
            p, q = probs[row, t, best[t]].item(), 0.8 if best[t] == target[t] else 0.05
            expected.append(p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q)))
    assert any(b != t for row in range(rollout.num_rows) for b, t in zip(probs[row].argmax(-1).tolist(),
               sorted(rollout.prompt_ids[row].tolist()), strict=True))  # fmt: skip
    assert_close(part.loss.item(), sum(expected) / len(expected), rtol=1e-5, atol=1e-6)


def test_a_support_of_the_whole_vocabulary_is_the_jsd_by_hand():
    """k = V: the generalised JSD (alpha 0.5) of the student's whole distribution and the teacher's (0.8, 0.05 x 4)."""
    policy = student()
    rollout = rollout_of(policy)
    update = update_of(policy, SortTeacher(V, L, confidence=0.8), rl_coef=0.0, mode="topk_logits", topk=V, alpha=0.5)
    part, _ = loss_and_grads(update, rollout)
    probs = student_probabilities(policy, rollout)
    expected = []
    for row in range(rollout.num_rows):
        target = sorted(rollout.prompt_ids[row].tolist())
        for t in range(L):
            s = probs[row, t].tolist()
            q = [0.8 if v == target[t] else 0.05 for v in range(V)]
            m = [(a + b) / 2 for a, b in zip(s, q, strict=True)]
            expected.append(0.5 * sum(a * math.log(a / c) for a, c in zip(s, m, strict=True))
                            + 0.5 * sum(b * math.log(b / c) for b, c in zip(q, m, strict=True)))  # fmt: skip
    assert_close(part.loss.item(), sum(expected) / len(expected), rtol=1e-5, atol=1e-6)


def test_after_the_first_update_each_divergence_is_weighed_by_the_clipped_ratio():
    policy = student()
    rollout = rollout_of(policy)
    with torch.no_grad():  # the policy moves away from the sampler: ratios differ from 1
        for p in policy.parameters():
            p.add_(0.5 * torch.randn_like(p))
    teacher = SortTeacher(V, L, confidence=0.8)
    options = dict(rl_coef=0.0, mode="topk_logits", topk=2, add_tail=True, epochs=2)
    plain, _ = loss_and_grads(update_of(policy, teacher, **options), copy.copy(rollout))
    clipped_rollout = copy.copy(rollout)
    clipped, _ = loss_and_grads(update_of(policy, teacher, is_clip=1.1, **options), clipped_rollout)
    with torch.no_grad():
        log_probs, _ = policy.token_log_probs(clipped_rollout)
    ratio = (log_probs - clipped_rollout.old_log_probs).exp()
    assert bool((ratio > 1.1).any()) and bool((ratio < 1.0).any())
    # token-mean of the divergence d_t: plain = mean(d), clipped = mean(d * min(ratio, 1.1))
    with torch.no_grad():
        _, _, student_top = policy.support_log_probs(clipped_rollout, clipped_rollout.teacher_top_ids)
    d = top_k_distillation_loss(student_top, clipped_rollout.teacher_top_log_probs, None, 1.0, True)
    assert_close(plain.loss, d.mean(), rtol=1e-5, atol=1e-6)
    assert_close(clipped.loss, (d * ratio.clamp(max=1.1)).mean(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", [{}, {"mode": "topk_logits", "topk": V, "alpha": 0.5}], ids=["sampled", "topk"])
def test_skip_tokens_leaves_the_first_response_tokens_out_of_the_distillation_loss(mode):
    """Position t < 2 of every row contributes 0; the token-mean still divides by every token (as for untaught rows)."""
    policy = student()
    rollout = rollout_of(policy)
    teacher = SortTeacher(V, L, confidence=0.8)
    whole, _ = loss_and_grads(update_of(policy, teacher, rl_coef=0.0, **mode), copy.copy(rollout))
    skipped, _ = loss_and_grads(update_of(policy, teacher, rl_coef=0.0, skip_tokens=2, **mode), copy.copy(rollout))
    per_token = whole.teacher_kl[0] if not mode else None
    if per_token is not None:  # the sampled loss at the first update is the sampled reverse KL itself
        assert_close(skipped.loss.item(), per_token[:, 2:].sum().item() / per_token.numel(), rtol=1e-5, atol=1e-6)
    else:
        with torch.no_grad():
            _, _, student_all = policy.support_log_probs(rollout, torch.arange(V).expand(rollout.num_rows, L, V))
        q = torch.full((rollout.num_rows, L, V), 0.05)
        for row in range(rollout.num_rows):
            for t, token in enumerate(sorted(rollout.prompt_ids[row].tolist())):
                q[row, t, token] = 0.8
        d = top_k_distillation_loss(student_all, q.log(), None, 0.5)
        assert_close(whole.loss.item(), d.mean().item(), rtol=1e-5, atol=1e-6)
        assert_close(skipped.loss.item(), d[:, 2:].sum().item() / d.numel(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_a_teacher_equal_to_the_student_gives_zero_loss_and_zero_gradient(alpha):
    policy = student()
    rollout = rollout_of(policy)
    update = update_of(policy, copy.deepcopy(policy), rl_coef=0.0, mode="topk_logits", topk=3, alpha=alpha)
    part, grads = loss_and_grads(update, rollout)
    assert abs(part.loss.item()) < 1e-7
    assert all(grad.abs().max() < 1e-7 for grad in grads)


def test_top_k_distillation_learns_from_the_scripted_teacher(in_tmp_dir):
    module = RLVRModule(
        student(embedding_dim=16),
        optimizer=lambda params: torch.optim.Adam(params, lr=0.03),
        group_size=4,
        teacher=SortTeacher(V, L),
        distillation=DistillationConfig(rl_coef=0.0, mode="topk_logits", topk=2, alpha=0.5, add_tail=True),
    )
    _, recorder = fit(module, [SortInclusionOrderingReward()], steps=30, batch_size=16)
    kl = [step["train/teacher_kl"] for step in recorder.steps]  # the sampled reverse KL, as in sampled_token
    assert sum(kl[-5:]) / 5 < 0.7 * sum(kl[:5]) / 5


def test_the_self_teacher_s_top_k_update_follows_trls_formula_on_a_hand_built_re_prompt(tokenizer_dir):  # noqa: F811
    """TRL `compute_topk_self_distillation_loss` (alpha 0.5, renormalised, the student's top-k) with the teacher's
    logits from the hand-built re-prompt, masked to the taught rows, averaged per row then over rows. The teacher is
    the initial weights and the policy has moved, so that an untaught row (scored behind its own prompt) is not
    taught by 0."""
    policy = policy_of(tokenizer_dir)
    rollout = sdpo_rollout_of(policy)
    teacher = make_teacher(SelfTeacher(weights="base"), policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    update = PolicyUpdate(
        policy, PPOClip(), AggregationConfig(mode="seq-mean-token-mean"), KLConfig(), None,
        ImportanceSamplingConfig(), UpdateConfig(), 0.0, SamplingConfig(),
        teacher=teacher, distillation=DistillationConfig(rl_coef=0.0, mode="topk_logits", topk=4, alpha=0.5),
    )  # fmt: skip
    update.add_old_and_reference_log_probs(rollout)
    mask = rollout.response_mask.bool()
    sizes = MiniBatchSizes(rollout.num_rows, int(mask.sum()))
    policy.zero_grad(set_to_none=True)
    update.micro_batch_loss(rollout, mask, sizes, True, True).loss.backward()
    ours = [p.grad.clone() for p in policy.parameters() if p.grad is not None]

    tail = "\n\nCorrectly solve the original question.\n"
    demos = [1, 3, 1, 1]  # rows 0-3 are taught (row 1 skips itself); rows 4-7 have no success in their group
    texts = [
        f"<|user|>What is 2+3?\nCorrect solution:\n\n{rollout.response_text[d]}\n\n{tail}<|endoftext|><|assistant|>"
        for d in demos
    ]
    by_hand = rollout.select(torch.arange(4))
    by_hand.prompt_ids, by_hand.prompt_mask = left_pad(
        [policy.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts], policy.pad_token_id
    )
    by_hand.group_index, by_hand.group_size = torch.arange(4), 1
    policy.zero_grad(set_to_none=True)
    own = rollout.select(torch.arange(4))
    with torch.no_grad():
        _, _, ids = policy.top_log_probs(own, 4)  # the student's top-k on its own prompt
        with policy.reference_scoring(teacher.copy) as scorer:
            _, _, teacher_top = scorer.support_log_probs(by_hand, ids)
    assert torch.equal(rollout.teacher_top_ids[:4][mask[:4]], ids[mask[:4]])
    _, _, student_top = policy.support_log_probs(own, ids)
    s = student_top - torch.logsumexp(student_top, -1, keepdim=True)
    q = teacher_top - torch.logsumexp(teacher_top, -1, keepdim=True)
    m = torch.logsumexp(torch.stack([s + math.log(0.5), q + math.log(0.5)]), dim=0)
    per_token = 0.5 * (s.exp() * (s - m)).sum(-1) + 0.5 * (q.exp() * (q - m)).sum(-1)
    row_mask = mask[:4].float()
    trl = ((per_token * row_mask).sum(-1) / row_mask.sum(-1).clamp(min=1.0)).sum() / rollout.num_rows
    trl.backward()
    theirs = [p.grad.clone() for p in policy.parameters() if p.grad is not None]
    assert len(ours) == len(theirs) and any(g.abs().sum() > 0 for g in ours)
    for mine, reference in zip(ours, theirs, strict=True):
        assert_close(mine, reference, rtol=1e-5, atol=1e-7)


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match=r"distillation.alpha=0.5 applies to distillation.mode=topk_logits"):
        DistillationConfig(alpha=0.5)
    with pytest.raises(ValueError, match=r"distillation.add_tail=True applies to distillation.mode=topk_logits"):
        DistillationConfig(add_tail=True)
    with pytest.raises(ValueError, match=r"distillation.support=teacher applies to distillation.mode=topk_logits"):
        DistillationConfig(support="teacher")
    with pytest.raises(OptionValueError, match=r"distillation.mode"):
        DistillationConfig(mode="full_logits")
    with pytest.raises(OptionValueError, match=r"distillation.is_clip"):
        DistillationConfig(mode="topk_logits", is_clip=0.0)
    with pytest.raises(OptionValueError, match=r"distillation.topk"):
        DistillationConfig(mode="topk_logits", topk=0)
    with pytest.raises(ValueError, match=rf"distillation.topk={V + 1} is over the policy's vocabulary of {V} tokens"):
        RLVRModule(
            student(), teacher=SortTeacher(V, L), distillation=DistillationConfig(mode="topk_logits", topk=V + 1)
        )


def test_ppo_with_a_shared_value_head_refuses_top_k_distillation():
    from rlvr_lightning.modules import PPOModule
    from rlvr_lightning.modules.ppo_options import ValueConfig

    with pytest.raises(ValueError, match=r"topk_logits .* value.model=shared"):
        PPOModule(
            student(),
            value=ValueConfig(model="shared"),
            group_size=4,
            teacher=SortTeacher(V, L),
            distillation=DistillationConfig(mode="topk_logits", topk=2),
        )
