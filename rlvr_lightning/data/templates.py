"""Prompt templates for math tasks: how a question becomes an example's `"prompt"`.

A task applies its `template` to each question; the policy then renders the prompt with its own
`prompt_template`. The two must agree:

=================  ==================================================  =========================
task `template`    the example's prompt                                HFPolicy `prompt.template`
=================  ==================================================  =========================
``"chat_boxed"``   the question plus an instruction to box the answer  ``chat`` (the model's chat template)
``"chat_boxed_``   ``chat_boxed`` plus an instruction to state one's     ``chat``
``confidence"``    confidence in ``<confidence>`` tags (RLCR)
``"r1_zero"``      the full R1-Zero text, ending in ``Assistant: <think>``  ``raw``
``"plain"``        ``Question: ...\\nAnswer:``                           ``raw``
``"question"``     the question as is                                  ``chat`` (or a policy template)
any string with    that string, ``{question}`` replaced                 as suits the string
``{question}``
=================  ==================================================  =========================

The R1-Zero template is the one of DeepSeek-R1-Zero (DeepSeek-AI 2025, table 1) as used by
Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") and CS336 assignment 5: the
prompt already opens the ``<think>`` block, so a well-formed completion is
``reasoning </think> <answer> answer </answer>``; `R1FormatReward` knows this.
"""

from __future__ import annotations

R1_ZERO_TEMPLATE = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n"
    "User: {question}\n"
    "Assistant: <think>"
)
BOXED_INSTRUCTION = "Put your final answer within \\boxed{}."
CHAT_BOXED_TEMPLATE = "{question}\n" + BOXED_INSTRUCTION
CONFIDENCE_INSTRUCTION = (
    "Then state how confident you are that it is right, a number from 0 to 1, in <confidence></confidence> tags."
)
CHAT_BOXED_CONFIDENCE_TEMPLATE = CHAT_BOXED_TEMPLATE + " " + CONFIDENCE_INSTRUCTION
PLAIN_TEMPLATE = "Question: {question}\nAnswer:"

TEMPLATES: dict[str, str] = {
    "chat_boxed": CHAT_BOXED_TEMPLATE,
    "chat_boxed_confidence": CHAT_BOXED_CONFIDENCE_TEMPLATE,
    "r1_zero": R1_ZERO_TEMPLATE,
    "plain": PLAIN_TEMPLATE,
    "question": "{question}",
}

#: the HFPolicy `prompt.template` each named template is meant for
POLICY_PROMPT_TEMPLATE: dict[str, str] = {
    "chat_boxed": "chat",
    "chat_boxed_confidence": "chat",
    "r1_zero": "raw",
    "plain": "raw",
    "question": "chat",
}


def resolve_template(template: str) -> str:
    """A template name from `TEMPLATES`, or a custom string containing `{question}`."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    if "{question}" not in template:
        raise ValueError(
            f"template {template!r} is neither one of {sorted(TEMPLATES)} nor a string containing '{{question}}'"
        )
    return template


def apply_template(template: str, question: str) -> str:
    """The prompt for `question` (`str.replace`, so braces elsewhere in the template are literal)."""
    return resolve_template(template).replace("{question}", question)


__all__ = [
    "BOXED_INSTRUCTION",
    "CHAT_BOXED_TEMPLATE",
    "PLAIN_TEMPLATE",
    "POLICY_PROMPT_TEMPLATE",
    "R1_ZERO_TEMPLATE",
    "TEMPLATES",
    "apply_template",
    "resolve_template",
]
