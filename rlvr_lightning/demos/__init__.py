"""Tiny models, tokenizers and tasks that tests, scripts and docs share; nothing is downloaded.

* `tiny_lm`: a random 2-layer Llama's config (`tiny_llama_config`) and a byte-level BPE tokenizer trained on the
  spot (`build_tiny_tokenizer`, `save_tiny_tokenizer`);
* `named_digit`: "repeat the named digit", a task a tiny Llama learns in a few dozen GRPO steps, its reward, and
  `rlvr fit` configs that train it;
* `stated_confidence`: a task whose answers are sometimes a guess, on which the tiny Llama learns to state a calibrated
  confidence (RLCR's `CalibrationReward`).

The top layer: it may use every other one, and nothing in the package imports it.
"""
