"""Multi-turn generation: responses generated in segments with inserted tokens between them, and the rules
that decide what is inserted: `ToolUse` (the policy's `tools` option), `ThinkingBudget` (`thinking_budget`),
`VerifiersTurns` (a verifiers multi-turn environment's protocol)."""

from rlvr_lightning.multiturn.segmented_generation import SegmentRule
from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.multiturn.tool_use import ToolUse
from rlvr_lightning.multiturn.verifiers_turns import VerifiersTurns

__all__ = ["SegmentRule", "ThinkingBudget", "ToolUse", "VerifiersTurns"]
