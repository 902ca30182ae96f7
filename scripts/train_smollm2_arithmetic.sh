#!/usr/bin/env bash
# Train the SmolLM2 arithmetic recipe (configs/smollm2_arithmetic.yaml) on a CPU, logging to a CSV
# file flushed every step (and rollout samples to the console), with one torch thread.
#
#   scripts/train_smollm2_arithmetic.sh /tmp/smollm2_arith            # one hour (trainer.max_time)
#   scripts/train_smollm2_arithmetic.sh /tmp/trial --trainer.max_time=00:00:05:00
#   CONFIG=configs/smollm2_calculator.yaml scripts/train_smollm2_arithmetic.sh /tmp/calc   # another recipe
#
# Checkpoints (last.ckpt every 10 steps, final.ckpt at the end) go beside the CSV log, where Lightning puts
# them for a ModelCheckpoint without dirpath: RUN_DIR/csv/version_0/checkpoints/ (version_1, ... on reruns).
# Then: python scripts/eval_arithmetic.py eval --config configs/smollm2_arithmetic.yaml --ckpt RUN_DIR/csv/version_0/checkpoints/final.ckpt
#       python scripts/eval_arithmetic.py plot --csv RUN_DIR/csv/version_0/metrics.csv
set -euo pipefail
RUN_DIR=$(realpath -m "${1:-/tmp/smollm2_arith}")
shift || true
REPO=$(cd "$(dirname "$0")/.." && pwd)
CONFIG=$(realpath "${CONFIG:-$REPO/configs/smollm2_arithmetic.yaml}")
PYTHON=${PYTHON:-python}
mkdir -p "$RUN_DIR"
cd "$RUN_DIR"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cat > "$RUN_DIR/logging.yaml" <<YAML
trainer:
  default_root_dir: $RUN_DIR
  enable_progress_bar: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {save_dir: $RUN_DIR, name: csv, flush_logs_every_n_steps: 1}
YAML
exec "$PYTHON" -m rlvr_lightning.cli fit --config "$CONFIG" --config "$RUN_DIR/logging.yaml" "$@"
