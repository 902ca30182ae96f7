"""`RowEnds`: which rows of our decoding loop end at each step, decided on the host from the step's tokens."""

from __future__ import annotations

from collections.abc import Sequence

from rlvr_lightning.generation.output import StopStringChecker


class RowEnds:
    """The host's view of the rows: which end at a step, from that step's tokens (one device-to-host copy per
    step: on a GPU every read of a device value waits for the queued work). Indexed by original row: `lengths`,
    `finished`, `by_string`; by row of the current (compacted) batch: `active` (its original row), `alive`."""

    def __init__(
        self,
        num_rows: int,
        max_new_tokens: int,
        eos_token_ids: Sequence[int],
        stop: StopStringChecker | None,
        caps: list[int] | None,
    ) -> None:
        self.eos_ids = set(eos_token_ids)
        self.stop, self.caps = stop, caps
        self.lengths = [max_new_tokens] * num_rows
        self.finished = [False] * num_rows
        self.by_string = [False] * num_rows
        self.history: list[list[int]] = [[] for _ in range(num_rows)] if stop else []
        self.active = list(range(num_rows))
        self.alive = [True] * num_rows

    def end(self, sampled: list[int], step: int) -> list[int]:
        """The batch rows that end with the tokens `sampled` at `step` (EOS, a stop string, their cap)."""
        active, alive, stop = self.active, self.alive, self.stop
        ended, candidates = [], []
        for i, row in enumerate(active):
            if not alive[i]:
                continue
            if stop:
                self.history[row].append(sampled[i])
            if sampled[i] in self.eos_ids:
                ended.append(i)
                self.finished[row] = True
            elif stop and stop.may_end(sampled[i]):
                candidates.append(i)
        if candidates:
            lo = max(0, step + 1 - stop.window)
            hits = stop.check([self.history[active[i]][lo:] for i in candidates])
            for i, hit in zip(candidates, hits, strict=True):
                if hit:
                    ended.append(i)
                    self.finished[active[i]] = self.by_string[active[i]] = True
        if self.caps is not None:
            ending = set(ended)
            ended += [i for i, row in enumerate(active) if alive[i] and i not in ending and self.caps[row] <= step + 1]
        for i in ended:
            self.lengths[active[i]] = step + 1
            alive[i] = False
        return ended

    def keep(self, keep: list[int]) -> None:
        """The batch was compacted to its rows `keep` (all alive)."""
        self.active, self.alive = [self.active[i] for i in keep], [True] * len(keep)
