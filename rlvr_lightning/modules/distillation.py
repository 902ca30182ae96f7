"""On-policy distillation in `RLVRModule`: a frozen teacher scores the student's sampled tokens (the teacher may
also be a `SelfTeacher`, the policy itself re-prompted with a correct response (SDPO) or the row's demonstration
(SDFT): `self_distillation.py`).

    model:
      init_args:
        teacher:                         # any policy that scores the student's token ids
          class_path: rlvr_lightning.modules.policy_checkpoint.policy_from_checkpoint
          init_args: {checkpoint_path: ..., policy: {...}}
        distillation: {coef: 1.0, rl_coef: 0.0}

The per-token loss becomes ``rl_coef * policy_loss(advantages) + coef * distillation_loss`` (the sampled
reverse KL to the teacher as a per-token advantage, `core/losses/distillation.py`; with `mode: topk_logits` a
divergence between the two distributions over a top-k support, `core/losses/logit_distillation.py`), before the rollout
importance weights, the KL penalty and the entropy bonus; ``rl_coef: 0`` distils alone (the rewards are
still computed and logged, and validation accuracy still reads them). The teacher scores at the sampling
temperature, as the student's log-probs are computed.

The teacher must tokenize as the policy does: the loss compares log-probs of the same token ids.
`Teacher` refuses a teacher whose vocabulary differs when the module is built.

Placement: the teacher is held outside the module tree. It is not among the trained parameters, not in the
optimizer, not pushed to a vLLM engine and not in checkpoints: a resumed run builds it again from its
configuration, as the first run did (a `policy_from_checkpoint` teacher reads its file again).
`configure_model` moves it to the strategy's device, or, under FSDP2, shards it as the KL reference is
sharded (resharded after every forward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor

from rlvr_lightning.core.losses.distillation import distillation_loss, prefix_drift_weights
from rlvr_lightning.core.losses.logit_distillation import top_k_distillation_loss
from rlvr_lightning.modules.self_distillation import SelfTeacher, place_frozen, set_teacher_scores, teacher_scores
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import (
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    PROBABILITY,
    OneOf,
    Range,
)

# facts of a policy without a tokenizer (ToySortPolicy) that fix what its token ids mean
TOKEN_FACTS = ("vocab_size", "eos_token", "prompt_length", "response_length")
DISTILLATION_MODES = ("sampled_token", "topk_logits")


@documented_options
@dataclass(frozen=True)
class DistillationConfig:
    """How the distillation loss is mixed with the reward objective (used only with a `teacher`)."""

    coef: Annotated[float, Option("weight of the distillation loss (> 0).")] = 1.0
    rl_coef: Annotated[
        float, Option("weight of the policy loss on the rewards' advantages (0: distillation alone).")
    ] = 1.0
    position_weight_gamma: Annotated[
        float,
        Option(
            "IW-OPD (arXiv 2606.22600): weigh each token's distillation advantage by 1 + gamma x the share of its "
            "row's teacher-student drift not yet accumulated before it (0: unweighted; the paper: 0.5).",
            NON_NEGATIVE,
        ),
    ] = 0.0

    future_gamma: Annotated[
        float,
        Option(
            "sampled_token: MiniLLM's long-term part, each token's advantage the gamma-discounted sum of those from "
            "it to the end of its response (0: each token alone; 1: all that follow).",
            PROBABILITY,
        ),
    ] = 0.0
    length_normalization: Annotated[
        bool, Option("with future_gamma: that sum divided by the sum of its discounts (MiniLLM's; TRL's default).")
    ] = True
    skip_tokens: Annotated[
        int,
        Option(
            "the first response tokens the distillation loss leaves out, though they count in its divisors (TRL's "
            "SDFT num_loss_tokens_to_skip, against a teacher prompt's artifacts).",
            NON_NEGATIVE_INT,
        ),
    ] = 0
    mode: Annotated[
        str,
        Option(
            "sampled_token (the sampled reverse KL as a per-token advantage) | topk_logits (a divergence between "
            "the two distributions over a support of topk tokens at each position).",
            OneOf(DISTILLATION_MODES),
        ),
    ] = "sampled_token"
    topk: Annotated[int, Option("topk_logits: the support's tokens per position (TRL's SDFT: 100).", POSITIVE_INT)] = (
        100
    )
    support: Annotated[
        str,
        Option(
            "topk_logits: student (its top-k as it sampled, TRL's local trainers) | teacher (the teacher's top-k, "
            "TRL's teacher server; with add_tail, else the student's mass outside it goes unpenalised).",
            OneOf(("student", "teacher")),
        ),
    ] = "student"
    alpha: Annotated[
        float,
        Option(
            "topk_logits: 0 the forward KL (teacher || student), 1 the reverse KL (student || teacher), between: "
            "GKD's generalised Jensen-Shannon divergence (TRL's SDFT: 0.5).",
            PROBABILITY,
        ),
    ] = 1.0
    add_tail: Annotated[
        bool, Option("topk_logits: one more category holds the mass outside the top-k (false: renormalised).")
    ] = False
    is_clip: Annotated[
        float | None,
        Option(
            "topk_logits: after the first update, each token's divergence times min(pi / pi_old, is_clip), "
            "detached (TRL's distillation_is_clip: 2.0); null: unweighted.",
            Range(0, low_open=True, optional=True),
        ),
    ] = None

    def __post_init__(self) -> None:
        check_options(DistillationConfig, vars(self), "distillation.")
        for name in ("coef", "rl_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"distillation.{name} must be >= 0, got {getattr(self, name)}")
        if self.coef == 0:
            raise ValueError("distillation.coef=0 switches distillation off; remove the teacher instead")
        if not self.length_normalization and self.future_gamma == 0:
            raise ValueError("distillation.length_normalization=false applies to distillation.future_gamma > 0")
        if self.mode == "topk_logits" and self.future_gamma != 0:
            raise ValueError(
                f"distillation.future_gamma={self.future_gamma} applies to distillation.mode=sampled_token; "
                "topk_logits compares the distributions at each position, with no advantage to sum"
            )
        if self.mode == "sampled_token":
            for name, default in (("alpha", 1.0), ("add_tail", False), ("is_clip", None), ("support", "student")):
                if getattr(self, name) != default:
                    raise ValueError(
                        f"distillation.{name}={getattr(self, name)} applies to distillation.mode=topk_logits; "
                        "mode sampled_token estimates the reverse KL from the sampled token alone"
                    )

    @property
    def support_size(self) -> int:
        """The tokens per position both models score (`topk_logits`; 0: the sampled token's log-prob alone)."""
        return self.topk if self.mode == "topk_logits" else 0


def check_distillation(
    teacher: Policy | SelfTeacher | None, distillation: DistillationConfig, student: Policy | None = None
) -> None:
    """Distillation options without a teacher are a mistake, not a no-op; a top-k must fit the vocabulary."""
    default = DistillationConfig()
    if teacher is None and distillation != default:
        given = ", ".join(f"{k}: {v}" for k, v in vars(distillation).items() if v != getattr(default, k))
        raise ValueError(
            f"distillation={{{given}}} weighs the "
            "distillation loss, but there is no teacher: set model.init_args.teacher (a policy with the student's "
            "tokenizer)"
        )
    config = getattr(student, "hf_config", None)
    vocab = getattr(student, "vocab_size", None) or getattr(config, "vocab_size", None)
    if teacher is not None and vocab is not None and distillation.support_size > vocab:
        raise ValueError(
            f"distillation.topk={distillation.topk} is over the policy's vocabulary of {vocab} tokens; "
            f"topk={vocab} is the whole distribution"
        )


def tokenizer_mismatch(student: Policy, teacher: Policy) -> str | None:
    """Why `teacher`'s token ids do not mean what `student`'s mean, or None when they do."""
    student_tokenizer, teacher_tokenizer = getattr(student, "tokenizer", None), getattr(teacher, "tokenizer", None)
    if student_tokenizer is not None or teacher_tokenizer is not None:
        if student_tokenizer is None or teacher_tokenizer is None:
            which = "the policy" if teacher_tokenizer is None else "the teacher"
            return f"only {which} has a tokenizer"
        student_vocab, teacher_vocab = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
        if student_vocab == teacher_vocab:
            return None
        differ = sorted(
            token
            for token in student_vocab.keys() | teacher_vocab.keys()
            if student_vocab.get(token) != teacher_vocab.get(token)
        )
        example = differ[0]
        return (
            f"the vocabularies differ ({len(student_vocab)} tokens vs {len(teacher_vocab)}; e.g. {example!r} is "
            f"{student_vocab.get(example)} for the policy, {teacher_vocab.get(example)} for the teacher)"
        )
    for name in TOKEN_FACTS:
        mine, theirs = getattr(student, name, None), getattr(teacher, name, None)
        if mine != theirs:
            return f"{name} is {mine} for the policy, {theirs} for the teacher"
    return None


class Teacher:
    """The frozen teacher of on-policy distillation (see the module docstring)."""

    def __init__(self, policy: Policy, student: Policy) -> None:
        problem = tokenizer_mismatch(student, policy)
        if problem is not None:
            raise ValueError(
                f"teacher: {type(policy).__name__} does not share the policy's tokenizer ({problem}); distillation "
                "compares log-probs of the same token ids"
            )
        trained = {id(p) for p in student.parameters()}
        if any(id(p) in trained for p in policy.parameters()):
            raise ValueError("teacher: the teacher shares weights with the policy; give it its own model")
        self.policy = policy
        policy.requires_grad_(False)
        policy.eval()

    def place(self, pl_module) -> None:
        """On the strategy's device; sharded as the KL reference under FSDP2 (`configure_model`)."""
        place_frozen(self.policy, pl_module)

    def score(
        self, rollout: Rollout, by_micro_batch: Callable, temperature: float, top_k: int = 0, own_support: bool = True
    ) -> None:
        """Set `rollout.teacher_log_probs` (with `top_k`, its scores of a support too: `teacher_scores`), micro-batch
        by micro-batch."""
        scored = by_micro_batch(rollout, lambda mb: teacher_scores(self.policy, mb, temperature, top_k, own_support))
        set_teacher_scores(rollout, scored)


@torch.no_grad()
def score_with_teacher(
    teacher: Teacher | SelfTeacher, student: Policy, rollout: Rollout, by_micro_batch: Callable, temperature: float,
    config: DistillationConfig,
) -> None:  # fmt: skip
    """The teacher's scores of `rollout`; with `topk_logits` and `support: student`, of the student's top-k tokens at
    each position, which are found first (the policy as it sampled)."""
    own_support = config.support == "teacher"
    if config.support_size and not own_support:
        top = by_micro_batch(
            rollout, lambda mb: student.top_log_probs(mb, config.support_size, temperature=temperature)
        )
        rollout.teacher_top_ids = top[2]
    teacher.score(rollout, by_micro_batch, temperature, config.support_size, own_support)


def make_teacher(teacher: Policy | SelfTeacher | None, student: Policy) -> Teacher | SelfTeacher | None:
    """The distillation teacher of `RLVRModule(teacher=...)`: a frozen policy, or a `SelfTeacher`."""
    if isinstance(teacher, SelfTeacher):
        return teacher.bind(student)
    return None if teacher is None else Teacher(teacher, student)


def distilled_token_loss(
    log_probs: Tensor,
    support_log_probs: Tensor | None,
    micro: Rollout,
    mask: Tensor | None,
    config: DistillationConfig,
    weights: Tensor | None,
) -> tuple[Tensor, tuple[Tensor, Tensor | None]]:
    """`[n, T]` the micro-batch's distillation loss per token (times the sampler's importance `weights`, if any),
    and (its reverse-KL estimate per token, the tokens the teacher teaches) for the metrics. `support_log_probs`:
    with `topk_logits`, the student's log-probs `[n, T, k]` of the support (`Policy.support_log_probs`)."""
    taught = teacher_token_mask(micro, mask, config.skip_tokens)  # SDPO: the rows with a demonstration
    gamma = config.position_weight_gamma
    distilled = distillation_loss(
        log_probs, micro.old_log_probs, micro.teacher_log_probs, taught, gamma, config.future_gamma,
        config.length_normalization,
    )  # fmt: skip
    loss = distilled.loss
    if config.mode == "topk_logits":
        clip = None
        if config.is_clip is not None and micro.old_log_probs is not None:
            clip = (log_probs, micro.old_log_probs, config.is_clip)
        topk = micro.teacher_top_log_probs
        loss = top_k_distillation_loss(support_log_probs, topk, taught, config.alpha, config.add_tail, clip)
        if gamma != 0:  # IW-OPD's weights of the rollout's drift apply to any per-token distillation loss
            loss = loss * prefix_drift_weights(-distilled.reverse_kl, taught, gamma)
    # the sampler/trainer correction applies to the distillation term as to a token-level loss
    loss = loss if weights is None else loss * weights
    return loss, (distilled.reverse_kl, taught)


def teacher_token_mask(micro: Rollout, mask: Tensor | None, skip_tokens: int = 0) -> Tensor | None:
    """The tokens the distillation loss counts: `mask` (None: all) on the rows the teacher scored, from the response's
    position `skip_tokens` on."""
    keep = mask
    if micro.teacher_rows is not None:
        rows = micro.teacher_rows.to(micro.response_mask.device).unsqueeze(-1)
        keep = rows.expand(micro.response_mask.shape) if keep is None else keep & rows
    if skip_tokens:  # TRL's SDFT num_loss_tokens_to_skip: token_positions >= n
        positions = torch.arange(micro.response_mask.shape[1], device=micro.response_mask.device)
        late = (positions >= skip_tokens).expand(micro.response_mask.shape)
        keep = late if keep is None else keep & late
    return keep
