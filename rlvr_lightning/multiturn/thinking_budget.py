"""`ThinkingBudget`: cap the tokens a reasoning model spends between `<think>` and `</think>` (Qwen3).

    policy:
      class_path: rlvr_lightning.policies.hf.HFPolicy
      init_args:
        generation:
          thinking_budget:
            class_path: rlvr_lightning.multiturn.thinking_budget.ThinkingBudget
            init_args: {max_thinking_tokens: 512}

Thinking is open from the end of a prompt whose last tag is an unclosed `<think>` (the R1-Zero template),
or from the segment in which the model writes `<think>` itself (Qwen3's chat template). When the model has
sampled `max_thinking_tokens` tokens inside it without closing it, `forced_text` (which holds `</think>`,
optionally after an "answer now" phrase) is inserted, masked out of the loss (`TokenSource.FORCED`), and
generation goes on for the answer up to `sampling.max_new_tokens` in all (the forced text counts).
As Qwen3's model card suggests, e.g.

    forced_text: "\\n\\nConsidering the limited time by the user, I have to give the solution based on the
      thinking directly now.\\n</think>\\n\\n"

Tool observations inside the thinking do not count against its budget. The tags must show in the decoded
text (plain or added tokens, not special tokens that decoding skips): stop strings are matched on text.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlvr_lightning.multiturn.segmented_generation import Codec, Insert, RowState, Segment, SegmentRule
from rlvr_lightning.rollout import TokenSource

BEFORE, OPEN, CLOSED = "before", "open", "closed"


class ThinkingBudget(SegmentRule):
    def __init__(
        self,
        max_thinking_tokens: int,
        open_tag: str = "<think>",
        close_tag: str = "</think>",
        forced_text: str = "\n</think>\n\n",
    ) -> None:
        """
        Args:
            max_thinking_tokens: sampled tokens allowed after `open_tag` before `forced_text` is inserted (>= 0).
            open_tag: what opens the thinking.
            close_tag: what closes the thinking.
            forced_text: inserted at the cap; must contain `close_tag`.
        """
        if max_thinking_tokens < 0:
            raise ValueError(f"ThinkingBudget max_thinking_tokens must be >= 0, got {max_thinking_tokens}")
        if not open_tag or not close_tag:
            raise ValueError("ThinkingBudget open_tag and close_tag must be non-empty")
        if close_tag not in forced_text:
            raise ValueError(f"ThinkingBudget forced_text {forced_text!r} must contain close_tag {close_tag!r}")
        self.max_thinking_tokens = max_thinking_tokens
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.forced_text = forced_text

    @property
    def stop_strings(self) -> list[str]:
        return [self.open_tag, self.close_tag]

    def begin(self, row: RowState, codec: Codec) -> None:
        opened = row.prompt_text.rfind(self.open_tag)
        row.notes["thinking"] = OPEN if opened >= 0 and row.prompt_text.rfind(self.close_tag) < opened else BEFORE
        row.notes["thinking_start"] = 0
        row.notes["thinking_forced"] = False

    def observe(self, row: RowState, segment: Segment, codec: Codec) -> None:  # updates the state, never decides
        # a segment stops at either tag, so it holds at most one of them, at its end
        if row.notes["thinking"] == BEFORE and self.open_tag in segment.text:
            row.notes["thinking"] = OPEN
            row.notes["thinking_start"] = len(row.tokens)
        elif row.notes["thinking"] == OPEN and self.close_tag in segment.text:
            row.notes["thinking"] = CLOSED
            row.notes["thinking_tokens"] = row.sampled_since(row.notes["thinking_start"])

    def cap(self, row: RowState) -> int | None:
        if row.notes["thinking"] != OPEN:
            return None
        return max(0, self.max_thinking_tokens - row.sampled_since(row.notes["thinking_start"]))

    def at_cap(self, row: RowState, codec: Codec) -> Insert:
        row.notes["thinking_tokens"] = row.sampled_since(row.notes["thinking_start"])
        row.notes["thinking"] = CLOSED
        row.notes["thinking_forced"] = True
        return Insert(text=self.forced_text, source=TokenSource.FORCED)

    def stats(self, rows: Sequence[RowState]) -> dict[str, float]:
        num = max(len(rows), 1)
        thought = [row for row in rows if row.notes["thinking"] != BEFORE]
        tokens = [row.notes.get("thinking_tokens", row.sampled_since(row.notes["thinking_start"])) for row in thought]
        return {
            "thinking/forced_fraction": sum(row.notes["thinking_forced"] for row in rows) / num,
            "thinking/tokens_mean": sum(tokens) / max(len(tokens), 1),
        }
