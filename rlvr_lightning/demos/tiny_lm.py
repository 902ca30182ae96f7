"""A tiny random Llama and a byte-level BPE tokenizer trained on the spot: nothing is downloaded.

    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config

    tokenizer_dir = save_tiny_tokenizer(tmp_path / "tok")
    policy = HFPolicy(HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)))

`bench_corpus` is a larger synthetic corpus (a ~500-token vocabulary for benchmarks); `bias_tokens` raises the
logits of chosen tokens (a forward hook), to steer a random model towards them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "What is 2+3? The answer is 5.",
    "A verifiable reward checks the final answer against the ground truth.",
    "Group relative policy optimisation samples several answers for each prompt.",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20.",
    "ab ab abc abcd stop STOP halt. Think step by step, then answer.",
]

PAD, EOS, BOS = "<|pad|>", "<|endoftext|>", "<|startoftext|>"
SPECIAL_TOKENS = [PAD, EOS, BOS, "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def bench_corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Synthetic text (sentences and arithmetic) with enough merges for a ~500-token vocabulary."""
    import random

    rng = random.Random(seed)
    words = " ".join(SENTENCES).split()
    corpus = list(SENTENCES)
    for _ in range(lines):
        a, b = rng.randrange(1000), rng.randrange(1000)
        corpus.append(f"What is {a} + {b}? {' '.join(rng.choices(words, k=6))} The answer is {a + b}.")
    return corpus


def build_tiny_tokenizer(
    vocab_size: int = 320, with_pad: bool = True, chat_template: bool = True, corpus: list[str] | None = None
) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus or SENTENCES, trainer)
    kwargs: dict[str, Any] = {"eos_token": EOS, "bos_token": BOS}
    if with_pad:
        kwargs["pad_token"] = PAD
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kwargs)
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_tokenizer(directory: str | Path, **kwargs: Any) -> Path:
    directory = Path(directory)
    build_tiny_tokenizer(**kwargs).save_pretrained(str(directory))
    return directory


def tiny_llama_config(**overrides: Any) -> dict[str, Any]:
    """An `HFPolicy(config=...)` dict: vocab size and special token ids come from the tokenizer."""
    config: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }
    config.update(overrides)
    return config


def bias_tokens(policy, token_ids, bias: float):
    """Add `bias` to the logits of `token_ids` (a forward hook on the LM head); returns the hook handle."""
    import torch

    head = policy.base_model.get_output_embeddings()
    ids = torch.as_tensor(list(token_ids))

    def hook(module, inputs, output):
        output = output.clone()
        output[..., ids] += bias
        return output

    return head.register_forward_hook(hook)
