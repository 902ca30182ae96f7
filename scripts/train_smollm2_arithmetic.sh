#!/usr/bin/env bash
# Train the SmolLM2 arithmetic recipe on a CPU, one torch thread, logging to a CSV file flushed every step:
#   1. the format warm-up ($WARMUP_CONFIG, by default configs/smollm2_arithmetic_warmup.yaml: SFT on 1-digit sums,
#      ~1.5 min), skipped when RUN_DIR/checkpoints/warmup/warmup.ckpt exists;
#   2. GRPO from it (configs/smollm2_arithmetic.yaml, or $CONFIG).
#
#   scripts/train_smollm2_arithmetic.sh /tmp/smollm2_arith                      # seed 0
#   scripts/train_smollm2_arithmetic.sh /tmp/smollm2_arith_s1 --seed_everything 1
#   CONFIG=configs/smollm2_calculator.yaml scripts/train_smollm2_arithmetic.sh /tmp/calc   # another recipe (no warm-up)
#   WARMUP_CONFIG=configs/smollm2_rlcr_warmup.yaml CONFIG=configs/smollm2_rlcr.yaml scripts/train_smollm2_arithmetic.sh /tmp/rlcr
#
# Extra arguments go to the RL stage (and --seed_everything to both; --config and --ckpt_path files may be relative to
# where the script is called). The RL stage's log is
# RUN_DIR/csv/version_0/metrics.csv (the warm-up's RUN_DIR/csv_warmup/...); its checkpoints
# (last.ckpt every 10 steps, final.ckpt at the end) are in RUN_DIR/csv/checkpoints/ (run name csv).
# Then: python scripts/eval_arithmetic.py eval --config configs/smollm2_arithmetic.yaml --ckpt RUN_DIR/csv/checkpoints/final.ckpt
#       python scripts/learning_suite.py --only smollm2_arithmetic --plot     (all seeds' curves)
set -euo pipefail
RUN_DIR=$(realpath -m "${1:-/tmp/smollm2_arith}")
shift || true
# the stages run inside RUN_DIR: a file named by a relative path (--config, --ckpt_path) is made absolute first
args=()
for arg in "$@"; do
  case "$arg" in
    --config=*|--ckpt_path=*) value=${arg#*=}; [ -e "$value" ] && arg="${arg%%=*}=$(realpath "$value")" ;;
    *) [ -e "$arg" ] && [[ "${args[-1]:-}" == --config || "${args[-1]:-}" == --ckpt_path ]] && arg=$(realpath "$arg") ;;
  esac
  args+=("$arg")
done
set -- "${args[@]}"
REPO=$(cd "$(dirname "$0")/.." && pwd)
CONFIG=$(realpath "${CONFIG:-$REPO/configs/smollm2_arithmetic.yaml}")
WARMUP_CONFIG=$(realpath "${WARMUP_CONFIG:-$REPO/configs/smollm2_arithmetic_warmup.yaml}")
WARMUP_DATA=$(sed -n 's/^ *train_file: *//p' "$WARMUP_CONFIG" | head -1)  # relative to the repository
PYTHON=${PYTHON:-python}
mkdir -p "$RUN_DIR"
cd "$RUN_DIR"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
logging() {  # a CSV logger flushed every step, under RUN_DIR/$1, and the run's checkpoints in RUN_DIR/$1/checkpoints
  cat > "$RUN_DIR/logging_$1.yaml" <<YAML
run_name: $1
trainer:
  default_root_dir: $RUN_DIR
  enable_progress_bar: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {save_dir: $RUN_DIR, name: $1, flush_logs_every_n_steps: 1}
YAML
}
seed=()
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --seed_everything) j=$((i + 1)); seed=(--seed_everything "${!j}") ;;
    --seed_everything=*) seed=("${!i}") ;;
  esac
done
if grep -q "checkpoints/warmup/warmup.ckpt" "$CONFIG" && [ ! -f checkpoints/warmup/warmup.ckpt ]; then
  logging csv_warmup
  "$PYTHON" -m rlvr_lightning.cli fit --config "$WARMUP_CONFIG" \
    --config "$RUN_DIR/logging_csv_warmup.yaml" \
    --data.init_args.train_file "$REPO/$WARMUP_DATA" "${seed[@]}"
fi
logging csv
exec "$PYTHON" -m rlvr_lightning.cli fit --config "$CONFIG" --config "$RUN_DIR/logging_csv.yaml" "$@"
