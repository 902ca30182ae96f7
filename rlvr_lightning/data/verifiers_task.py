"""`VerifiersTask`: the prompts of a verifiers environment's dataset.

    task:
      class_path: rlvr_lightning.data.verifiers_task.VerifiersTask
      init_args: {environment: my_env_package, env_args: {difficulty: easy}, num_val: 50}

The environment (`rlvr_lightning.runtime.vf_environments.load_environment`) formats its dataset as verifiers does (its
system prompt, few-shot examples): each row's `prompt` is a list of chat messages, which `HFPolicy` renders
with its chat template (`prompt.template: chat`). An example is ``{"prompt": <messages>, "answer": ...,
"vf_input": <the row>}``; `VerifiersRubricReward` scores with the environment's rubric and `VerifiersTurns`
plays its multi-turn protocol. Validation uses the environment's eval dataset when it has one, else the last
`num_val` rows of its dataset, which training then leaves out.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from rlvr_lightning.data.task import Example, ListDataset, Task
from rlvr_lightning.runtime.vf_environments import load_environment, plain_row


class VerifiersTask(Task):
    def __init__(
        self, environment: str, env_args: dict[str, Any] | None = None, num_val: int = 0, num_train: int | None = None
    ) -> None:
        """
        Args:
            environment: the verifiers environment: "package.module" (its `load_environment`) or "module:function".
            env_args: keyword arguments of the environment's `load_environment`.
            num_val: validation rows taken from the end of the training dataset when the environment has no
                eval dataset (0: none).
            num_train: use only the first `num_train` training rows (None: all).
        """
        if num_val < 0:
            raise ValueError(f"num_val must be >= 0, got {num_val}")
        self.environment = environment
        self.env_args = dict(env_args or {})
        self.env = load_environment(environment, self.env_args)
        rows = [self.example(row) for row in self.env.get_dataset()]
        eval_dataset = self.env.eval_dataset
        if eval_dataset is not None:
            self.val = [self.example(row) for row in self.env.get_eval_dataset()]
            self.train = rows
        else:
            split = len(rows) - num_val
            if split < 1:
                raise ValueError(f"num_val={num_val} leaves no training rows of the {len(rows)} in the dataset")
            self.train, self.val = rows[:split], rows[split:]
        if num_train is not None:
            self.train = self.train[:num_train]

    @staticmethod
    def example(row: dict[str, Any]) -> Example:
        vf_input = plain_row(row)
        return {"prompt": vf_input["prompt"], "answer": str(vf_input.get("answer", "")), "vf_input": vf_input}

    def train_dataset(self) -> Dataset:
        return ListDataset(self.train)

    def val_dataset(self) -> Dataset | None:
        return ListDataset(self.val) if self.val else None

    def example_location(self, split: str, index: int) -> str:
        return f"{self.environment} {split} row {index}"


__all__ = ["VerifiersTask"]
