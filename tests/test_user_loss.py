"""A loss and a KL estimator of the user's own, in a file outside the package, named in the YAML by class_path
(as a user's reward is): `rlvr fit` builds them from their init_args and trains with them."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

USER_CODE = """
import json

import lightning.pytorch as pl
import torch

from rlvr_lightning.core.kl import KLEstimator
from rlvr_lightning.core.losses.policy_losses import PolicyLoss, PolicyLossOutput


def _count(path, key):
    try:
        with open(path) as f:
            counts = json.load(f)
    except FileNotFoundError:
        counts = {}
    counts[key] = counts.get(key, 0) + 1
    with open(path, "w") as f:
        json.dump(counts, f)


class ClippedPG(PolicyLoss):
    needs_old_log_probs = False

    def __init__(self, max_advantage: float = 1.0, calls: str = "calls.json"):
        self.max_advantage, self.calls = max_advantage, calls

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        _count(self.calls, f"loss max_advantage={self.max_advantage}")
        a = advantages.clamp(-self.max_advantage, self.max_advantage)
        a = a.unsqueeze(-1) if a.dim() == 1 else a
        loss = -a * log_probs
        if mask is not None:
            loss = loss * mask
        return PolicyLossOutput(loss=loss, ratio=torch.ones_like(log_probs).detach(), mask=mask)


class SquaredLogRatio(KLEstimator):
    def __init__(self, scale: float = 1.0, calls: str = "calls.json"):
        self.scale, self.calls = scale, calls

    def __call__(self, log_probs, ref_log_probs):
        _count(self.calls, f"kl scale={self.scale}")
        return self.scale * (ref_log_probs - log_probs) ** 2


class RecordWeights(pl.Callback):
    def __init__(self, out: str = "weights.json"):
        self.out, self.norms = out, {}

    def _norm(self, module):
        return float(torch.cat([p.detach().flatten() for p in module.policy.parameters()]).norm())

    def on_train_start(self, trainer, module):
        self.norms["start"] = self._norm(module)

    def on_train_end(self, trainer, module):
        self.norms["end"] = self._norm(module)
        with open(self.out, "w") as f:
            json.dump(self.norms, f)
"""

CONFIG = """
seed_everything: 0
trainer:
  max_epochs: 1
  limit_train_batches: 3
  limit_val_batches: 0
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage
    - class_path: my_loss.RecordWeights
      init_args: {{out: {weights}}}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 8}}
    optimizer:
      class_path: torch.optim.Adam
      init_args: {{lr: 0.01}}
    group_size: 4
    loss:
      class_path: my_loss.ClippedPG
      init_args: {{max_advantage: 2.0, calls: {calls}}}
    kl:
      coef: 0.1
      estimator:
        class_path: my_loss.SquaredLogRatio
        init_args: {{scale: 0.5, calls: {calls}}}
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 8
    task:
      class_path: rlvr_lightning.data.SortTask
      init_args: {{vocab_size: 5, length: 3, num_val: 8, seed: 0}}
"""


def test_rlvr_fit_trains_with_a_loss_and_a_kl_estimator_from_a_users_file(tmp_path):
    (tmp_path / "my_loss.py").write_text(USER_CODE)
    calls, weights = tmp_path / "calls.json", tmp_path / "weights.json"
    config = tmp_path / "run.yaml"
    config.write_text(textwrap.dedent(CONFIG).format(calls=calls, weights=weights))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "WANDB_MODE": "disabled"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr_lightning.cli",
            "fit",
            "--config",
            str(config),
            f"--trainer.default_root_dir={tmp_path}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(calls.read_text())
    # one call per micro-batch and rollout step (one epoch, one mini-batch): 3 steps; the init_args reached the objects
    assert counts == {"loss max_advantage=2.0": 3, "kl scale=0.5": 3}
    norms = json.loads(weights.read_text())
    assert norms["end"] != norms["start"]
