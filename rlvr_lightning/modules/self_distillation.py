"""Self-distillation (SDPO): the policy, re-prompted with a successful response of the same prompt, is the teacher.

SDPO (Hübotter et al. 2026, "Reinforcement Learning via Self-Distillation", arXiv:2601.20802) turns a group's
successes into a dense signal for every response of the group: each response is scored twice, by the policy
on its own prompt (the student) and by a teacher, the same network shown the prompt followed by a correct
response of its group ("Correct solution: ..."); the on-policy distillation loss (`core/losses/distillation.py`,
the sampled reverse KL as a per-token advantage) pulls the student toward the teacher's feedback-informed
prediction. A response without a demonstration (no success in its group, or, with `exclude_self`, only itself)
has no distillation loss; it still counts in the loss's divisors, as in TRL's `SDPOTrainer`. With `feedback`, the
teacher is also shown what the rewards said of the response itself (`rollout.feedback`, e.g. the failed test of
`CodeExecutionReward`): a failed response with feedback is taught even where its group has no success.

    model:
      init_args:
        teacher:
          class_path: rlvr_lightning.modules.SelfTeacher
          init_args: {weights: ema, ema_rate: 0.05, success_threshold: 1.0}
        distillation: {coef: 1.0, rl_coef: 0.0}    # TRL's distillation_weight w: coef = w, rl_coef = 1 - w

`weights`: `live` scores with the policy itself; `ema` with an exponential moving average of it, moved toward the
policy by `ema_rate` before each step's scoring (after the previous step's update); `base` with the initial
weights. The copy `ema` and `base` keep is part of the module, so checkpoints hold it and a resumed run goes on
with it. With LoRA, `base` is the model with the adapter disabled while the adapter is fresh (a whole copy when it
was loaded trained, e.g. a warm-up's: disabled, it would be the model before the warm-up), and `ema` a whole copy
of the model whose adapter factors are averaged, each on its own (TRL's PEFT EMA teacher, started from the
policy's adapter).

SDFT (Shenfeld et al. 2026, "Self-Distillation Enables Continual Learning", arXiv:2601.19897) is the same teacher
shown the row's own demonstration from the data instead (`demonstrations: data`, the text in
`metadata[demonstration_key]`, e.g. a JSONL task's worked solution), in TRL's SDFT teacher prompt
(`{prompt}\n\n{privileged_context}`): every row with a demonstration is taught and no reward is read, on-policy
learning from demonstrations where SFT would train on them off-policy. TRL's SDFT defaults to logit-level
distillation (`distillation.mode: topk_logits`, `topk: 100`, `alpha: 0.5`) and the `base` teacher.

Rollouts come from a policy that samples text (`HFPolicy`): the re-prompt is built from the prompt as the data
gave it (a string, or chat messages whose last user message is re-written) and the demonstration's decoded text,
then rendered by the policy's own `prompt.template`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from rlvr_lightning.core.demonstrations import demonstration_rows
from rlvr_lightning.generation.loop import left_pad
from rlvr_lightning.parallel.fsdp import data_parallel_mesh, reshard_policy, shard_policy, sharding_options
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.policies.lora_reference import fresh_adapter
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.devices import set_compute_device
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import FINITE, OneOf, Placeholders, Range

TEACHER_WEIGHTS = ("live", "ema", "base")
# TRL trl/experimental/sdpo/sdpo_config.py: reprompt_template, solution_template, feedback_template
REPROMPT_TEMPLATE = "{prompt}{solution}{feedback}\n\nCorrectly solve the original question.\n"
SOLUTION_TEMPLATE = "\nCorrect solution:\n\n{successful_previous_attempt}\n\n"
# TRL trl/experimental/sdft/sdft_config.py teacher_prompt_template "{prompt}\n\n{privileged_context}", in two parts
DATA_REPROMPT_TEMPLATE = "{prompt}{solution}{feedback}"
DATA_SOLUTION_TEMPLATE = "\n\n{privileged_context}"
DEMONSTRATIONS = ("group", "data")
# the placeholder of a demonstration's text in solution_template, by where demonstrations come from
DEMONSTRATION_PLACEHOLDER = {"group": "{successful_previous_attempt}", "data": "{privileged_context}"}
FEEDBACK_TEMPLATE = "\nThe following is feedback from your unsuccessful earlier attempt:\n\n{feedback_raw}\n\n"
PLACEHOLDERS = re.compile(r"\{prompt\}|\{solution\}|\{feedback\}")
THINKING = re.compile(r"<think>.*?</think>", flags=re.DOTALL)


def place_frozen(model: nn.Module, pl_module) -> None:
    """A frozen scoring model (a distillation teacher, a self-teacher's copy) on the strategy's device, or under
    FSDP2 sharded as the KL reference is (resharded after every forward)."""
    strategy = pl_module.trainer.strategy
    mesh = data_parallel_mesh(pl_module)
    if mesh is not None and any(True for _ in model.parameters()):
        shard_policy(model, mesh, sharding_options(strategy), root_reshard_after_forward=True)
    elif mesh is None:
        model.to(strategy.root_device)
    set_compute_device(model, strategy.root_device)


def teacher_scores(
    scorer: Policy, rollout: Rollout, temperature: float, top_k: int = 0, own_support: bool = True
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """A teacher's log-probs `[N, T]` of the sampled tokens (no grad); with `top_k`, also its log-probs and the ids
    `[N, T, k]` of a support: its own top-k (`own_support`), else the ids on `rollout.teacher_top_ids` (the
    student's top-k)."""
    with torch.no_grad():
        if not top_k:
            return scorer.token_log_probs(rollout, temperature=temperature)[0]
        if own_support:
            return scorer.top_log_probs(rollout, top_k, temperature=temperature)
        log_probs, _, on_support = scorer.support_log_probs(rollout, rollout.teacher_top_ids, temperature)
        return log_probs, on_support, rollout.teacher_top_ids


def set_teacher_scores(rollout: Rollout, scores: Tensor | tuple[Tensor, Tensor, Tensor]) -> None:
    """The teacher's log-probs, and its top-k's log-probs and ids when `scores` has them, on `rollout`."""
    if isinstance(scores, tuple):
        rollout.teacher_log_probs, rollout.teacher_top_log_probs, rollout.teacher_top_ids = scores
    else:
        rollout.teacher_log_probs = scores


@documented_options
class SelfTeacher(nn.Module):
    def __init__(
        self,
        weights: Annotated[
            str,
            Option("live (the policy) | ema (its moving average) | base (its first weights).", OneOf(TEACHER_WEIGHTS)),
        ] = "ema",
        ema_rate: Annotated[
            float, Option("with weights: ema, the step toward the policy before each step.", Range(0, 1, low_open=True))
        ] = 0.05,
        demonstrations: Annotated[
            str,
            Option(
                "group (SDPO: a successful response of the row's group) | data (SDFT: the row's own demonstration, "
                "its metadata[demonstration_key], e.g. a JSONL task's worked solution; every row is taught).",
                OneOf(DEMONSTRATIONS),
            ),
        ] = "group",
        demonstration_key: Annotated[str, Option("with demonstrations: data, the metadata field shown.")] = "solution",
        success_threshold: Annotated[float, Option("the reward at which a response demonstrates.", FINITE)] = 1.0,
        exclude_self: Annotated[bool, Option("a successful response does not demonstrate for itself.")] = True,
        reprompt_template: Annotated[
            str | None,
            Option(
                "the teacher's prompt: {prompt}, then {solution}; null: SDPO's (group) or SDFT's (data).",
                Placeholders(("{prompt}", "{solution}"), optional=True),
            ),
        ] = None,
        solution_template: Annotated[
            str | None,
            Option(
                "how a demonstration is shown, its text in {successful_previous_attempt} (group) or "
                "{privileged_context} (data); null: SDPO's or SDFT's.",
                Placeholders(tuple(DEMONSTRATION_PLACEHOLDER.values()), optional=True, any_of=True),
            ),
        ] = None,
        strip_thinking: Annotated[bool, Option("remove <think>...</think> from demonstrations.")] = False,
        feedback: Annotated[
            bool, Option("show each response what the rewards said of it (rollout.feedback), in {feedback}.")
        ] = False,
        feedback_template: Annotated[
            str, Option("how feedback is shown; {feedback_raw}: its text.", Placeholders(("{feedback_raw}",)))
        ] = FEEDBACK_TEMPLATE,
        feedback_only_without_solution: Annotated[
            bool, Option("with feedback: only for responses without a demonstration.")
        ] = False,
    ) -> None:
        """SDPO's teacher: the policy re-prompted with a successful response of its group, or SDFT's, with the row's
        own demonstration (module docstring)."""
        check_options(SelfTeacher, locals())
        data = demonstrations == "data"
        super().__init__()
        self.placeholder = DEMONSTRATION_PLACEHOLDER[demonstrations]
        self.demonstrations, self.demonstration_key = demonstrations, demonstration_key
        self.weights, self.ema_rate, self.success_threshold = weights, ema_rate, success_threshold
        self.exclude_self, self.strip_thinking = exclude_self, strip_thinking
        self.reprompt_template = reprompt_template or (DATA_REPROMPT_TEMPLATE if data else REPROMPT_TEMPLATE)
        self.solution_template = solution_template or (DATA_SOLUTION_TEMPLATE if data else SOLUTION_TEMPLATE)
        self.feedback, self.feedback_template = feedback, feedback_template
        self.feedback_only_without_solution = feedback_only_without_solution
        self._student: tuple[Policy, ...] = ()  # a tuple: the policy is the module's, not a submodule of this one
        self.copy: nn.Module | None = None

    def bind(self, student: Policy) -> SelfTeacher:
        """Teach `student` (its copy made now, for `ema` and `base`)."""
        if not callable(getattr(student, "encode_prompts", None)):
            raise ValueError(
                f"teacher: SelfTeacher re-prompts the policy with text, and {type(student).__name__} has no text "
                "prompts; use a policy with a tokenizer (HFPolicy)"
            )
        if self.placeholder not in self.solution_template:
            raise ValueError(
                f"teacher.solution_template={self.solution_template!r} shows a demonstration in {self.placeholder} "
                f"with teacher.demonstrations={self.demonstrations}, and has no {self.placeholder}"
            )
        if self.feedback and "{feedback}" not in self.reprompt_template:
            raise ValueError(
                f"teacher.feedback=true shows feedback in {{feedback}}, and teacher.reprompt_template="
                f"{self.reprompt_template!r} has no {{feedback}}"
            )
        self._student = (student,)
        if self.weights == "live":
            self.copy = None
        elif getattr(student, "lora_r", 0) > 0 and (self.weights == "ema" or not fresh_adapter(student)):
            # ema: a whole copy, adapter included, whose adapter factors are averaged (as TRL's PEFT EMA teacher's);
            # base over an adapter that already adds something (a warm start): disabling it is not the first weights
            self.copy = student.create_reference(adapter=False)
        else:
            self.copy = student.create_reference()
        return self

    @property
    def student(self) -> Policy:
        return self._student[0]

    @property
    def policy(self) -> nn.Module | None:
        """The teacher's own model (None: the policy's), for the options that configure scoring models."""
        return self.copy

    def place(self, pl_module) -> None:
        """The copy beside the policy (`place_frozen`); the live policy is placed as the policy."""
        if self.copy is not None:
            place_frozen(self.copy, pl_module)

    @torch.no_grad()
    def score(
        self, rollout: Rollout, by_micro_batch: Callable, temperature: float, top_k: int = 0, own_support: bool = True
    ) -> None:
        """Set `rollout.teacher_log_probs` (with `top_k`, its scores of a support too: `teacher_scores`) and
        `rollout.teacher_rows` (the rows taught: a demonstration or feedback)."""
        if rollout.prompts is None or rollout.response_text is None:
            raise ValueError("SelfTeacher reads each row's prompt and response text; this rollout lacks one")
        if self.weights == "ema":
            # SDPO's EMA teacher (TRL teacher_sync.py): teacher <- (1 - rate) * teacher + rate * policy
            reshard_policy(self.student)  # a forward since the last step (old log-probs, the top-k) left it gathered
            Policy.update_reference(self.student, self.copy, alpha=self.ema_rate)  # every weight, LoRA's factors too
            torch.clear_autocast_cache()
        shown = self.demonstrations_shown(rollout)
        notes = self.feedback_shown(rollout, [text is not None for text in shown])
        taught = torch.tensor([text is not None or note is not None for text, note in zip(shown, notes, strict=True)])
        # every row is scored, an untaught one behind its own prompt (as TRL does): each data-parallel rank then
        # runs as many forwards as the others, which sharded (collective) forwards need; its loss is masked
        behind = self.reprompted(rollout, shown, notes)
        scored = by_micro_batch(behind, lambda mb: self.log_probs(mb, temperature, top_k, own_support))
        set_teacher_scores(rollout, scored)
        rollout.teacher_rows = taught.to(rollout.teacher_log_probs.device)

    def log_probs(
        self, rollout: Rollout, temperature: float, top_k: int = 0, own_support: bool = True
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        if self.copy is None:
            return teacher_scores(self.student, rollout, temperature, top_k, own_support)
        with self.student.reference_scoring(self.copy) as scorer:
            return teacher_scores(scorer, rollout, temperature, top_k, own_support)

    def demonstrations_shown(self, rollout: Rollout) -> list[str | None]:
        """Each row's demonstration text, None where it has none: a successful response of its group (`group`,
        `core/demonstrations.py`), or its own `metadata[demonstration_key]` (`data`)."""
        if self.demonstrations == "data":
            return [self.data_demonstration(row, metadata) for row, metadata in enumerate(rollout.metadata)]
        if rollout.reward is None:
            raise ValueError("SelfTeacher(demonstrations=group) reads each row's reward; this rollout has none")
        demos = demonstration_rows(rollout.reward, rollout.group_index, self.success_threshold, self.exclude_self)
        return [rollout.response_text[demo] if demo >= 0 else None for demo in demos.tolist()]

    def data_demonstration(self, row: int, metadata: dict[str, Any]) -> str | None:
        value = metadata.get(self.demonstration_key)
        if value is None:
            raise ValueError(
                f"SelfTeacher(demonstrations=data) shows each row's metadata[{self.demonstration_key!r}], and row "
                f"{row} has none (its fields: {', '.join(sorted(metadata)) or 'none'}); set teacher.demonstration_key"
            )
        return str(value) if str(value).strip() else None

    def feedback_shown(self, rollout: Rollout, demonstrated: list[bool]) -> list[str | None]:
        """Each row's feedback the teacher is shown (TRL's include_environment_feedback), None where none."""
        if not self.feedback or rollout.feedback is None:
            return [None] * rollout.num_rows
        with_solution = demonstrated
        return [
            note if note and note.strip() and not (self.feedback_only_without_solution and solved) else None
            for note, solved in zip(rollout.feedback, with_solution, strict=True)
        ]

    def reprompted(self, rollout: Rollout, shown: list[str | None], notes: list[str | None]) -> Rollout:
        """`rollout`'s responses as sampled, each behind its re-prompt (its own prompt where it has neither a
        demonstration nor feedback), each row a group of its own."""
        prompts = [
            prompt if text is None and note is None else self.reprompt(prompt, text, note)
            for prompt, text, note in zip(rollout.prompts, shown, notes, strict=True)
        ]
        ids, texts = self.student.encode_prompts(prompts)
        context = getattr(self.student, "max_context", None)
        longest = max(len(row) for row in ids) + rollout.response_ids.shape[1]
        if context is not None and longest > context:
            raise ValueError(
                f"SelfTeacher: a re-prompt and its response take {longest} tokens, over the model's context of "
                f"{context}; shorten the demonstrations (teacher.strip_thinking, sampling.max_new_tokens)"
            )
        prompt_ids, prompt_mask = left_pad(ids, self.student.pad_token_id)
        device = rollout.prompt_ids.device
        return dataclasses.replace(
            rollout,
            prompt_ids=prompt_ids.to(device),
            prompt_mask=prompt_mask.to(device),
            group_index=torch.arange(rollout.num_rows, device=rollout.group_index.device),  # re-prompts differ
            group_size=1,
            prompt_text=texts,
        )

    def reprompt(self, prompt: Any, demonstration: str | None, feedback: str | None = None) -> Any:
        """`prompt` with the demonstration and the feedback (each if any) after it, in the form the data gave it (text
        or chat messages)."""
        solution = ""
        if demonstration is not None:
            if self.strip_thinking:
                demonstration = THINKING.sub("", demonstration).strip()
            solution = self.solution_template.replace(self.placeholder, demonstration)
        shown = "" if feedback is None else self.feedback_template.replace("{feedback_raw}", feedback)

        def fill(text: str) -> str:  # one pass: a placeholder inside the prompt, solution or feedback stays as it is
            parts = {"{prompt}": text, "{solution}": solution, "{feedback}": shown}
            return PLACEHOLDERS.sub(lambda match: parts[match.group()], self.reprompt_template)

        if isinstance(prompt, str):
            return fill(prompt)
        messages = [dict(message) for message in prompt]
        users = [i for i, message in enumerate(messages) if message.get("role") == "user"]
        if not users:
            raise ValueError("SelfTeacher re-writes a chat prompt's last user message, and this prompt has none")
        # TRL keeps the messages before the last one and re-writes the last user message's text
        messages[users[-1]]["content"] = fill(str(messages[users[-1]]["content"]))
        return messages
