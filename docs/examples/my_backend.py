"""A generation backend in a file of its own: sampling with transformers' `model.generate`."""

import time

import torch

from rlvr_lightning.generation.loop import GenerationOutput, left_pad
from rlvr_lightning.policies import GenerationBackend
from rlvr_lightning.runtime.devices import compute_device


class TransformersGenerate(GenerationBackend):
    """Samples with `model.generate`; `generate_kwargs` passes anything else it takes (e.g. `repetition_penalty`)."""

    def __init__(self, generate_kwargs: dict | None = None):
        self.generate_kwargs = generate_kwargs or {}
        self.calls = 0

    def generate(
        self,
        model,
        tokenizer,
        prompt_token_ids,
        n,
        sampling,
        *,
        eos_token_ids,
        pad_token_id,
        max_new_tokens=None,
        generator=None,
    ):
        if max_new_tokens is not None or sampling.stop_strings or generator is not None:
            raise ValueError(
                "TransformersGenerate supports neither tools, thinking budgets, stop strings nor rollout_staleness: 1"
            )
        start = time.perf_counter()
        ids, mask = left_pad(prompt_token_ids, pad_token_id)
        device = compute_device(model)
        randomness = (
            dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
            if sampling.do_sample
            else dict(do_sample=False)  # greedy (validation)
        )
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    num_return_sequences=n,
                    max_new_tokens=sampling.max_new_tokens,
                    min_new_tokens=sampling.min_new_tokens,
                    eos_token_id=list(eos_token_ids),
                    pad_token_id=pad_token_id,
                    output_logits=True,
                    return_dict_in_generate=True,
                    **randomness,
                    **self.generate_kwargs,
                )
        finally:
            model.train(was_training)
        tokens = out.sequences[:, ids.shape[1] :]  # [N, T]: rows i*n .. i*n+n-1 answer prompt i
        # the log-prob of each sampled token under the unfiltered distribution at the sampling temperature
        logits = torch.stack(out.logits, dim=1).float() / sampling.temperature
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        is_eos = torch.isin(tokens, torch.tensor(list(eos_token_ids), device=tokens.device))
        response_mask = ((is_eos.long().cumsum(-1) - is_eos.long()) == 0).float()  # through the first EOS
        self.calls += 1
        return GenerationOutput(
            response_ids=tokens.masked_fill(response_mask == 0, pad_token_id),
            response_mask=response_mask,
            truncated=~is_eos.any(-1),
            log_probs=log_probs * response_mask,
            stopped_by_string=torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device),
            seconds=time.perf_counter() - start,
            stats={"transformers_generate_calls": float(self.calls)},  # logged as train/generation/<key>
        )
