"""SDPO on 2 processes under FSDP2 (gloo on CPU) with token-budget micro-batches: the ranks teach different
numbers of responses in a step, yet run the same sharded (collective) teacher forwards, and the run ends."""

from __future__ import annotations

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from tests.ddp_runs import fit_two_ranks

RECORDER = """
import json
import lightning.pytorch as pl

class TaughtRecorder(pl.Callback):
    def __init__(self, out: str):
        self.out, self.taught = out, []
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.taught.append(pl_module.last_rollout.teacher_rows.long().sum().item())
    def on_train_end(self, trainer, pl_module):
        json.dump({"taught": self.taught, "steps": trainer.global_step},
                  open(f"{self.out}/rank{trainer.global_rank}.json", "w"))
"""

CONFIG = """
seed_everything: 1
trainer:
  strategy: {{class_path: rlvr_lightning.parallel.FSDP2Strategy}}
  accelerator: cpu
  devices: 2
  max_epochs: 1
  limit_train_batches: 4
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  logger: false
  callbacks:
    - class_path: rlvr_lightning.rewards.ContainsReward
      init_args: {{target: a}}
    - class_path: taught_recorder.TaughtRecorder
      init_args: {{out: {out}}}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.HFPolicy
      init_args:
        model: {{config: {config}, tokenizer: {tokenizer}}}
        prompt: {{template: chat}}
    teacher:
      class_path: rlvr_lightning.modules.SelfTeacher
      init_args: {{weights: ema, ema_rate: 0.5}}
    distillation: {{coef: 1.0, rl_coef: 0.5}}
    group_size: 4
    sampling: {{max_new_tokens: 6}}
    update: {{micro_batch_tokens: 160}}
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 2
    task:
      class_path: rlvr_lightning.data.InlineTask
      init_args:
        examples:
          - prompt: "What is 2+3?"
          - prompt: "Say ab."
          - prompt: "Count: 1 2"
          - prompt: "abc?"
"""


def test_ranks_that_teach_different_rows_run_the_same_sharded_teacher_forwards(tmp_path):
    tokenizer = save_tiny_tokenizer(tmp_path / "tokenizer")
    config = CONFIG.format(out=tmp_path, config=tiny_llama_config(), tokenizer=tokenizer)
    ranks = fit_two_ranks(tmp_path, "taught_recorder", RECORDER, config)
    assert [rank["steps"] for rank in ranks] == [4, 4]
    assert ranks[0]["taught"] != ranks[1]["taught"]  # the case that needs every row scored on every rank
