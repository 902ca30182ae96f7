"""`ArithmeticTask`: synthetic, seeded arithmetic problems with their answers.

    task:
      class_path: rlvr_lightning.data.arithmetic.ArithmeticTask
      init_args: {digits: 2, operators: ["+"], num_operands: 2, num_val: 200, template: chat_boxed}

An example is ``{"prompt": <templated question>, "answer": "68", "question": "What is 23 + 45?",
"expression": "23 + 45"}``. Expressions follow the usual precedence (``*`` and ``/`` before ``+``
and ``-``); ``/`` is exact division: problems whose value is not an integer are redrawn.

Validation problems are held out by construction: an expression is a validation expression when
a CRC32 of its text is a multiple of `holdout_every`, and the training stream never yields one.
Training example `i` depends only on `(seed, i)`.
"""

from __future__ import annotations

import random
import zlib
from fractions import Fraction
from typing import Annotated

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from rlvr_lightning.data.sort_task import ListDataset
from rlvr_lightning.data.task import Example, Task
from rlvr_lightning.data.templates import apply_template, resolve_template
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT, Range

OPERATORS = ("+", "-", "*", "/")
MAX_DRAWS = 100_000


def evaluate(operands: list[int], operators: list[str]) -> Fraction:
    """Value of `operands[0] op[0] operands[1] ...` with `*`, `/` binding tighter than `+`, `-`."""
    terms: list[Fraction] = [Fraction(operands[0])]
    signs: list[int] = [1]
    for op, value in zip(operators, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= value
        elif op == "/":
            if value == 0:
                raise ZeroDivisionError
            terms[-1] /= value
        else:
            terms.append(Fraction(value))
            signs.append(1 if op == "+" else -1)
    return sum((s * t for s, t in zip(signs, terms, strict=True)), Fraction(0))


@documented_options
class ArithmeticTask(Task):
    def __init__(
        self,
        digits: Annotated[int, Option("digits of each operand (``2``: 10..99; ``1``: 0..9).", POSITIVE_INT)] = 2,
        operators: list[str] | str = "+",
        num_operands: Annotated[int, Option("operands per expression (>= 2).", Range(2, integer=True))] = 2,
        min_digits: Annotated[
            int | None,
            Option(
                "if set, each operand has between `min_digits` and `digits` digits.",
                Range(1, integer=True, optional=True),
            ),
        ] = None,
        allow_negative: bool = True,
        question_format: str = "What is {expression}?",
        template: str = "chat_boxed",
        num_val: Annotated[
            int, Option("held-out validation problems (distinct expressions); 0 for none.", NON_NEGATIVE_INT)
        ] = 200,
        num_train: Annotated[
            int | None,
            Option(
                "None streams fresh problems forever; an int fixes a training pool of that size.",
                Range(1, integer=True, optional=True),
            ),
        ] = None,
        holdout_every: Annotated[
            int, Option("one expression in this many (by hash) is reserved for validation.", Range(2, integer=True))
        ] = 10,
        seed: int = 0,
    ) -> None:
        """
        Args:
            operators: the operators to draw from, any of ``+ - * /`` (a list or a string like ``"+-"``).
            allow_negative: if False, problems with a negative answer are redrawn.
            question_format: the question, with ``{expression}`` replaced.
            template: how the question becomes the prompt (see `rlvr_lightning.data.templates`).
        """
        ops = list(operators)
        if not ops or any(op not in OPERATORS for op in ops):
            raise ValueError(f"operators must be a non-empty selection of {OPERATORS}, got {operators!r}")
        check_options(ArithmeticTask, locals())
        if min_digits is not None and not 1 <= min_digits <= digits:
            raise ValueError(f"min_digits must be in [1, digits={digits}], got {min_digits}")
        if "{expression}" not in question_format:
            raise ValueError(f"question_format must contain '{{expression}}', got {question_format!r}")
        resolve_template(template)  # fail at construction on a bad template
        self.digits = digits
        self.operators = ops
        self.num_operands = num_operands
        self.min_digits = min_digits or digits
        self.allow_negative = allow_negative
        self.question_format = question_format
        self.template = template
        self.num_val = num_val
        self.num_train = num_train
        self.holdout_every = holdout_every
        self.seed = seed

    # ------------------------------------------------------------------ problems

    def is_held_out(self, expression: str) -> bool:
        return zlib.crc32(expression.encode()) % self.holdout_every == 0

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def draw(self, rng: random.Random, held_out: bool) -> tuple[str, int]:
        """An (expression, integer answer) on the requested side of the split."""
        for _ in range(MAX_DRAWS):
            operands = [self._operand(rng) for _ in range(self.num_operands)]
            ops = [rng.choice(self.operators) for _ in range(self.num_operands - 1)]
            try:
                value = evaluate(operands, ops)
            except ZeroDivisionError:
                continue
            if value.denominator != 1 or (value < 0 and not self.allow_negative):
                continue
            expression = " ".join([str(operands[0])] + [f"{op} {x}" for op, x in zip(ops, operands[1:], strict=True)])
            if self.is_held_out(expression) == held_out:
                return expression, int(value)
        raise RuntimeError(f"ArithmeticTask: no valid problem in {MAX_DRAWS} draws; loosen the settings")

    def example(self, expression: str, answer: int) -> Example:
        question = self.question_format.replace("{expression}", expression)
        return {
            "prompt": apply_template(self.template, question),
            "answer": str(answer),
            "question": question,
            "expression": expression,
        }

    # ------------------------------------------------------------------ datasets

    def train_dataset(self) -> Dataset | IterableDataset:
        if self.num_train is None:
            return ArithmeticStream(self)
        return ListDataset([self.train_example(i) for i in range(self.num_train)])

    def train_example(self, index: int) -> Example:
        return self.example(*self.draw(random.Random(f"{self.seed}-train-{index}"), held_out=False))

    def val_dataset(self) -> Dataset | None:
        if self.num_val == 0:
            return None
        return ListDataset(self.val_examples())

    def val_examples(self) -> list[Example]:
        rng = random.Random(f"{self.seed}-validation")
        seen: set[str] = set()
        examples: list[Example] = []
        for _ in range(self.num_val * 100):
            expression, answer = self.draw(rng, held_out=True)
            if expression in seen:
                continue
            seen.add(expression)
            examples.append(self.example(expression, answer))
            if len(examples) == self.num_val:
                return examples
        raise ValueError(
            f"ArithmeticTask: could not find {self.num_val} distinct held-out problems "
            f"(found {len(examples)}); lower num_val or holdout_every, or widen the problem space"
        )


class ArithmeticStream(IterableDataset):
    """Endless seeded stream of training problems; split across DataLoader workers by stride."""

    def __init__(self, task: ArithmeticTask, start: int = 0) -> None:
        self.task = task
        self.start = start

    def __iter__(self):
        worker = get_worker_info()
        index, stride = self.start, 1
        if worker is not None:
            index, stride = self.start + worker.id, worker.num_workers
        while True:
            yield self.task.train_example(index)
            index += stride


__all__ = ["ArithmeticStream", "ArithmeticTask", "evaluate"]
