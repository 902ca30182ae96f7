"""`VerifiersTurns`: a verifiers multi-turn environment's protocol, played through our segmented generation.

    policy:
      class_path: rlvr_lightning.policies.hf.HFPolicy
      init_args:
        prompt:
          template: chat
        generation:
          tools:    # any segment rule goes here
            class_path: rlvr_lightning.multiturn.verifiers_turns.VerifiersTurns
            init_args: {environment: my_env_package}

Each assistant turn is sampled by our generation backend and ends at the model's end-of-turn token (EOS). The
rule then does what `vf.MultiTurnEnv.rollout` does between two model calls: it appends the turn to the
trajectory, checks the environment's stop conditions (`is_completed`: `max_turns`, `@vf.stop` methods, a
`final_env_response`), and otherwise asks `env_response(messages, state)` for the environment's messages. Those
are rendered with the tokenizer's chat template (the text the template puts after the assistant's turn, up to
and including the next assistant header) and inserted as tokens the policy did not sample (`TokenSource.TOOL`:
no loss on them). Token ids go in and come out: the policy's sampled ids are never re-tokenized.

The conversation after the prompt and the environment's state travel to the rewards in the rollout's metadata
(`vf_completion`, `vf_state`), where `VerifiersRubricReward` scores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr_lightning.multiturn.segmented_generation import Codec, Finish, Insert, RowState, Segment, SegmentRule
from rlvr_lightning.runtime.vf_environments import load_environment, new_state, normalize, plain_messages, run


class VerifiersTurns(SegmentRule):
    def __init__(self, environment: str, env_args: dict[str, Any] | None = None) -> None:
        """
        Args:
            environment: the verifiers multi-turn environment (as `VerifiersTask`'s).
            env_args: its `load_environment` arguments.
        """
        self.env = load_environment(environment, env_args)
        if not hasattr(self.env, "env_response"):
            raise ValueError(f"environment={environment!r} is not multi-turn (it has no env_response)")
        self.env_errors = 0

    def begin(self, row: RowState, codec: Codec) -> None:
        if "vf_input" not in row.metadata:
            raise ValueError("VerifiersTurns needs examples of a VerifiersTask (metadata 'vf_input')")
        vf_input = row.metadata["vf_input"]
        row.notes["vf_state"] = new_state(self.env, vf_input)
        row.notes["vf_prompt"] = plain_messages(vf_input["prompt"])
        row.notes["vf_completion"] = []
        row.notes["vf_turn_start"] = 0

    def observe(self, row: RowState, segment: Segment, codec: Codec) -> Insert | Finish | None:
        state, completion = row.notes["vf_state"], row.notes["vf_completion"]
        turn = row.tokens[row.notes["vf_turn_start"] :]
        message = {"role": "assistant", "content": codec.decode(turn, skip_special_tokens=True)}
        completion.append(message)
        state["trajectory"].append(
            {"prompt": None, "completion": normalize([message]), "response": None, "tokens": None,
             "reward": None, "advantage": None, "is_truncated": segment.ended != "eos", "extras": {}}
        )  # fmt: skip
        if segment.ended != "eos":  # a stop string or the budget ended the turn: the rollout ends with it
            return None
        try:
            if run(self.env.is_completed(state)):
                return Finish()
            reply = plain_messages(run(self.env.env_response(normalize(row.notes["vf_prompt"] + completion), state)))
        except Exception as error:  # an environment that fails ends its row, as verifiers' has_error does
            self.env_errors += 1
            state["error"] = error
            return Finish(truncated=True)
        completion.extend(reply)
        if state.get("final_env_response") is not None:  # the environment's last word: not sampled from
            return Finish()
        text = self._rendered_reply(row, completion, reply, turn, codec)
        inserted = codec.encode(text)
        row.notes["vf_turn_start"] = len(row.tokens) + len(inserted)
        return Insert(token_ids=inserted)

    @staticmethod
    def _rendered_reply(row: RowState, completion: list, reply: list, turn: Sequence[int], codec: Codec) -> str:
        """The chat template's text from the end of the sampled turn to the next assistant header."""
        template = codec.tokenizer.apply_chat_template
        before = template(row.notes["vf_prompt"] + completion[: len(completion) - len(reply)], tokenize=False)
        after = template(row.notes["vf_prompt"] + completion, tokenize=False, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template renders a conversation differently once a message is added")
        end_of_turn = codec.decode(turn[-1:]) if turn else ""
        trailer = before[before.rfind(end_of_turn) + len(end_of_turn) :] if end_of_turn in before else ""
        return trailer + after[len(before) :]

    def row_info(self, row: RowState) -> dict[str, Any]:
        state = row.notes["vf_state"]
        state["completion"] = normalize(row.notes["vf_completion"])
        return {"vf_state": state, "vf_completion": row.notes["vf_completion"]}

    def stats(self, rows: Sequence[RowState]) -> dict[str, float]:
        errors, self.env_errors = self.env_errors, 0
        return {"env_errors": float(errors)}


__all__ = ["VerifiersTurns"]
