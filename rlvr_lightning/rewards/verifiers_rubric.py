"""`VerifiersRubricReward`: a verifiers environment's rubric as our reward, with its weights and its parser.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.verifiers_rubric.VerifiersRubricReward
          init_args: {environment: my_env_package}

A row's score is the rubric's weighted sum: `sum_k weight_k * f_k(...)` over its reward functions (nested rubric
groups flattened, functions of weight 0 (verifiers' metrics) left out), each called with the arguments it names
(`prompt`, `completion`, `answer`, `state`, `info`, `task`, `parser`, ...), as `vf.Rubric` does. The completion
is the response as one assistant message, or for a multi-turn rollout (`VerifiersTurns`) the conversation after
the prompt and the state the environment kept. Unlike `vf.Rubric`, which scores a raising function 0 silently, a
function that raises, hangs past `timeout_s` or returns NaN fails its row (`RewardCallback`), counted in
`reward_errors/<name>`. Correct (validation accuracy) is a score of at least `correct_at`, by default the sum of
the positive weights (full marks).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.vf_environments import call_reward, load_environment, new_state, normalize, reward_terms


class VerifiersRubricReward(RewardCallback):
    kind = "task"

    def __init__(
        self,
        environment: str,
        env_args: dict[str, Any] | None = None,
        correct_at: float | None = None,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
        timeout_s: float | None = 60.0,
    ) -> None:
        """
        Args:
            environment: the verifiers environment (as `VerifiersTask`'s).
            env_args: its `load_environment` arguments.
            correct_at: a row scoring at least this is correct (default: the sum of the positive weights).
        """
        super().__init__(weight=weight, name=name or "rubric", on_error=on_error, timeout_s=timeout_s)
        self.env = load_environment(environment, env_args)
        self.terms = reward_terms(self.env)
        self.max_score = sum(w for _, _, w, _ in self.terms if w > 0)
        self.correct_at = self.max_score if correct_at is None else correct_at

    def state_of(self, rollout: Rollout, i: int):
        """The verifiers state of row `i`: the one its multi-turn rollout kept, else a new one, completed."""
        metadata = rollout.metadata[i]
        state = metadata.get("vf_state")
        if state is None:
            state = new_state(self.env, metadata["vf_input"])
            state["completion"] = normalize([{"role": "assistant", "content": rollout.response_text[i]}])
        return state

    def score_row(self, rollout: Rollout, i: int) -> float:
        state = self.state_of(rollout, i)
        return sum(weight * call_reward(function, rubric, state) for _, function, weight, rubric in self.terms)

    def score(self, rollout: Rollout) -> Tensor:
        if rollout.response_text is None:
            raise ValueError(f"{self.name} needs rollout.response_text (a language-model policy such as HFPolicy)")
        return super().score(rollout)

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return scores >= self.correct_at - 1e-9


__all__ = ["VerifiersRubricReward"]
