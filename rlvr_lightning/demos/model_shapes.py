"""The configurations of real models (their `config.json` values), for benchmarks that build them with random
weights: the steps, memory and kernels of the real shapes, with no weights to download.

    AutoConfig.for_model(**SMOLLM2_135M)
"""

from __future__ import annotations

SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M-Instruct
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}

QWEN2_5_1_5B = {  # Qwen/Qwen2.5-1.5B-Instruct
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
}
