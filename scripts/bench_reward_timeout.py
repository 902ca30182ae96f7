#!/usr/bin/env python
"""How long a step's scoring takes when a third of a reward's rows hang, against its time limit.

A `score_row` reward on one step's rows (`--rows`, 64: 8 prompts x 8 responses) that hangs on rows 0, 3, 6, ...
(blocked, as on a remote call that never answers) and scores the others at once, with `timeout_s` at
`--timeout_s` (the default limit, 60 s). Prints the scoring time, its ratio to the limit, and the time the
hanging rows would take handled one after another (one limit each), for comparison.

    python scripts/bench_reward_timeout.py                    # the default limit: about a minute
    python scripts/bench_reward_timeout.py --timeout_s 2
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from rlvr_lightning.rewards.base import DEFAULT_ROW_TIMEOUT_S, RewardCallback
from rlvr_lightning.rollout import Rollout

NEVER = threading.Event()


class HangsOnAThird(RewardCallback):
    def score_row(self, rollout, i):
        if i % 3 == 0:
            NEVER.wait()
        return 1.0


def step_rows(n: int) -> Rollout:
    ids = torch.zeros(n, 2, dtype=torch.long)
    return Rollout(
        prompt_ids=ids,
        prompt_mask=torch.ones_like(ids),
        response_ids=ids.clone(),
        response_mask=torch.ones(n, 2),
        group_index=torch.arange(n),
        group_size=1,
        truncated=torch.zeros(n, dtype=torch.bool),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--timeout_s", type=float, default=DEFAULT_ROW_TIMEOUT_S)
    args = parser.parse_args()
    reward = HangsOnAThird(timeout_s=args.timeout_s)
    rollout = step_rows(args.rows)
    started = time.monotonic()
    scores = reward(rollout)
    elapsed = time.monotonic() - started
    hanging = len(range(0, args.rows, 3))
    scored = int((scores == 1.0).sum())
    print(
        f"rows {args.rows}, hanging {hanging}, timeout_s {args.timeout_s:g}: scoring took {elapsed:.1f} s "
        f"= {elapsed / args.timeout_s:.2f} x the limit; {scored} of {args.rows - hanging} other rows scored; "
        f"one limit per hanging row, one after another, would be {hanging * args.timeout_s:g} s"
    )


if __name__ == "__main__":
    main()
