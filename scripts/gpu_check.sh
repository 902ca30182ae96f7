#!/usr/bin/env bash
# One command that checks the GPU paths on a CUDA machine and prints one summary table:
#   tests     the GPU tests (tests/gpu: the GSM8K recipe with each GPU setting, background rollouts on a
#             side stream, resume after Ctrl-C, host syncs per decoding step, attention kernels, lean
#             activations in fp32 and bf16 autocast, packed scoring through FlexAttention), in TEST_WORKERS
#             processes (default 4) with pytest-xdist
#   smollm2   10 steps of the GSM8K recipe with SmolLM2 (configs/gpu/offline_smollm2.yaml)
#   qwen_fsdp2     steps of the recipe at Qwen2.5-1.5B's size (random weights) sharded by FSDP2 over
#                  every GPU (NCCL; one GPU is a world of one)
#   qwen_offload   the same with CPU offload (configs/gpu/cpu_offload.yaml)
#   bench     scripts/bench_step.py, ours (the backend an HFPolicy picks on CUDA: static decoding) vs TRL's
#             GRPOTrainer on the GPU (needs TRL), the cases BENCH_CASES (default: smollm2 smollm2_long), BENCH_STEPS
#             measured steps (default 4), in each of BENCH_PRECISIONS (default: fp32 gpu; gpu: each side's bf16),
#             the legs BENCH_LEGS (default: ours trl; plain: ours without lean activations; trl_cb: TRL generating
#             through transformers' continuous batching, its fast path without vLLM); BENCH_PROFILE=1: one more step
#             per leg recorded by torch.profiler, its report in the log (scripts/step_profile.py)
#   static    tests/gpu/test_static_decoding_cuda.py alone: static decoding in each compile mode samples the eager
#             loop's tokens, one host sync per 8 steps, the default backend decodes statically on CUDA; a graph
#             captured under cached autocast, one first recorded in a background thread, a workspace from `validate`
#   decode    scripts/bench_decode.py: ms per decoding step, tokens/s, bandwidth as a fraction of the device's,
#             compile seconds, host syncs per step and tokens equal to the eager loop for each decoding variant
#             (DECODE_VARIANTS, default: eager loop, static cache, inductor + CUDA graphs, the inductor-compiled forward
#             in a captured CUDA graph, a captured CUDA graph of the eager step)
#             at DECODE_ROWS (default 64 128) rows on DECODE_MODELS (default: SmolLM2-135M's and Qwen2.5-1.5B's shapes,
#             random weights)
#   equal     scripts/bench_decode.py in EQUAL_DTYPES (default: float32 float64) at EQUAL_ROWS (default 128) rows,
#             16 tokens, on DECODE_MODELS, EQUAL_VARIANTS (default: each static variant, the compiled ones in fp32
#             only): the static step's tokens against the eager loop's, and of those that differ, how many first
#             differ by a neighbouring token id (a draw moved across one step of the CDF by rounding; fp64 settles it)
#   score     scripts/bench_score.py: forward and backward ms of one scoring micro-batch (32 rows, uneven lengths),
#             padded vs packed with the model's SDPA vs packed through FlexAttention vs prefix-shared, the kernel
#             that ran, fp32 and bf16 autocast, lean and plain activations, at SmolLM2-135M's shape (random
#             weights); then in bf16 padded and packed through inductor-compiled decoder layers (compile_layers)
#   vllm      the vLLM engine tests on CUDA (sleep mode, weight pushes), where vLLM is installed
# Each part runs under a time limit (PART_LIMIT_S, default 600 s; LIMIT_<part> for one part); with TOTAL_LIMIT_S the
# whole check ends within that many seconds: each part gets at most what is left (less 30 s for the summary), in the
# order named, and a part with under 30 s left is not run. Logs go to $GPU_CHECK_OUT (runs/gpu_check).
#
#   bash scripts/gpu_check.sh                       # every part
#   bash scripts/gpu_check.sh tests smollm2         # some parts
#   GSM8K_DIR=path/to/gsm8k STEPS=10 MAX_NEW_TOKENS=256 bash scripts/gpu_check.sh
#
# SmolLM2 comes from `rlvr-models fetch smollm2-135m-instruct`; where the cache holds its config and tokenizer
# but no weights, random weights of its shape are used (steps and memory are those of the real model).
# On a machine without network, scripts/gpu_bundle.sh gathers beforehand into .gpu (GPU_BUNDLE) the wheels of the
# packages its image lacks (installed first, without dependencies, ahead of the image's own), SmolLM2's config and
# tokenizer (RLVR_CACHE's default then) and GSM8K (GSM8K_DIR's default then).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${GPU_CHECK_OUT:-runs/gpu_check}"
limit="${PART_LIMIT_S:-600}"
steps="${STEPS:-10}"
new_tokens="${MAX_NEW_TOKENS:-256}"
bundle="${GPU_BUNDLE:-.gpu}"
gsm8k="${GSM8K_DIR:-../shared/data/gsm8k}"
[ -z "${GSM8K_DIR:-}" ] && [ -f "$bundle/gsm8k/train.jsonl" ] && gsm8k="$bundle/gsm8k"
[ -z "${RLVR_CACHE:-}" ] && [ -d "$bundle/cache/models" ] && export RLVR_CACHE="$(cd "$bundle/cache" && pwd)"
python="${PYTHON:-python3}"
workers=()  # pytest-xdist's workers for the tests part, where it is installed
"$python" -c "import xdist" 2>/dev/null && [ "${TEST_WORKERS:-4}" -gt 1 ] && workers=(-n "${TEST_WORKERS:-4}")
mkdir -p "$out"
wheels="$bundle/wheels"
if compgen -G "$wheels/*.whl" >/dev/null; then
    site="${TMPDIR:-/tmp}/rlvr_gpu_site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl || { echo "could not install the wheels in $wheels" >&2; exit 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests smollm2 qwen_fsdp2 qwen_offload bench decode equal score vllm)
rows=()

"$python" - <<'EOF' | tee "$out/environment.txt"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16 {torch.cuda.is_bf16_supported()}")
from importlib.metadata import version
for name in ("lightning", "transformers", "jsonargparse", "math_verify", "flash_attn", "vllm", "trl", "datasets",
             "pyarrow"):
    try:
        __import__(name)
        print(f"{name} {version(name.replace('_', '-'))}")
    except Exception as error:  # noqa: BLE001 - a package that fails to import is reported, not fatal
        print(f"{name} not importable ({type(error).__name__}: {error})")
EOF

# SmolLM2 with random weights where only its config and tokenizer are in the cache (drawn on the GPU), for the
# parts that load it
smollm2_dir=""
[[ " ${parts[*]} " =~ \ (smollm2|bench)\  ]] &&
    smollm2_dir="$("$python" -m rlvr_lightning.runtime.model_cache path smollm2-135m-instruct 2>/dev/null)"
if [ -n "$smollm2_dir" ] && [ -f "$smollm2_dir/config.json" ] && ! ls "$smollm2_dir"/*.safetensors >/dev/null 2>&1; then
    random_cache="${TMPDIR:-/tmp}/rlvr_gpu_random_cache"  # outside $out, which may be a folder sent back
    "$python" - "$smollm2_dir" "$random_cache/models/smollm2-135m-instruct" <<'EOF'
import shutil, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
source, target = sys.argv[1:]
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # a CPU draws them on one thread
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
model.save_pretrained(target)
AutoTokenizer.from_pretrained(source).save_pretrained(target)
print(f"SmolLM2: random weights of its shape in {target}")
EOF
    export RLVR_CACHE="$random_cache"
fi

# median of a metrics.csv column over the steps after the first (the first compiles and warms up)
metric() {
    "$python" - "$1" "$2" <<'EOF'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get(sys.argv[2])]
values = [float(r[sys.argv[2]]) for r in rows][1:] or [float(r[sys.argv[2]]) for r in rows]
print(f"{statistics.median(values):.3g}" if values else "-")
EOF
}

run_part() {  # name, figure command, command...
    local name=$1 figure=$2
    shift 2
    local started=$SECONDS
    echo "== $name: $*" | tee -a "$out/commands.txt"
    local seconds
    seconds=$(eval echo "\${LIMIT_$name:-$limit}")  # LIMIT_<part>=seconds overrides PART_LIMIT_S
    if [ -n "${TOTAL_LIMIT_S:-}" ]; then  # what is left of the whole check's time, less 30 s: the kill grace, the summary
        local left=$((TOTAL_LIMIT_S - SECONDS - 30))
        if [ "$left" -lt 30 ]; then
            rows+=("$(printf '%-13s %-18s %6s s  %s' "$name" "not run (time)" 0 "TOTAL_LIMIT_S=$TOTAL_LIMIT_S spent")")
            return
        fi
        [ "$left" -lt "$seconds" ] && seconds=$left
    fi
    timeout -k 20 "$seconds" bash -c '"$@"' "$name" "$@" >"$out/$name.log" 2>&1  # bash: the parts' functions
    local code=$? status=ok
    [ $code -eq 124 ] && status="timed out (${seconds} s)"
    [ $code -ne 0 ] && [ $code -ne 124 ] && status="FAILED ($code)"
    [ $code -eq 77 ] && status="skipped"
    rows+=("$(printf '%-13s %-18s %6s s  %s' "$name" "$status" $((SECONDS - started)) "$(eval "$figure" 2>/dev/null)")")
    tail -n 3 "$out/$name.log"
}

# the GSM8K recipe's callbacks without its checkpoint (a last.ckpt at the end: 1.6 GB for SmolLM2, 18 GB at
# Qwen2.5-1.5B's size with AdamW's state, written inside the part's time and onto a small disk)
recipe=configs/gsm8k_qwen2.5_math_1.5b.yaml
no_checkpoints="${TMPDIR:-/tmp}/rlvr_gpu_no_checkpoints.yaml"
"$python" - "$recipe" "$no_checkpoints" <<'EOF'
import sys
import yaml
trainer = yaml.safe_load(open(sys.argv[1]))["trainer"]
callbacks = [c for c in trainer["callbacks"] if not c["class_path"].endswith("ModelCheckpoint")]
yaml.safe_dump({"trainer": {"callbacks": callbacks, "enable_checkpointing": False}}, open(sys.argv[2], "w"))
EOF

fit_recipe() {  # name, steps, overlays... : the GSM8K recipe with a CSV logger in $out/$name
    local name=$1 n=$2
    shift 2
    local overlays=()
    for overlay in "$@"; do overlays+=(--config "configs/gpu/$overlay.yaml"); done
    [ "$name" = qwen_fsdp2 ] || overlays+=(--config "$no_checkpoints")  # qwen_fsdp2 checks the sharded checkpoint
    "$python" -m rlvr_lightning.cli fit --config "$recipe" "${overlays[@]}" \
        --run_name "gpu_check_$name" --trainer.default_root_dir "$out/$name" \
        --trainer.logger "{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {save_dir: $out/$name}}" \
        --trainer.limit_train_batches "$n" --trainer.limit_val_batches 0 \
        --trainer.enable_progress_bar false --model.init_args.sampling.max_new_tokens "$new_tokens" \
        --data.init_args.task.init_args.path "$gsm8k/train.jsonl" \
        --data.init_args.task.init_args.val_path "$gsm8k/test.jsonl"
}

fit_figure() {  # step time and sampling speed of a fit_recipe run
    local csv
    csv=$(find "$out/$1" -name metrics.csv | head -n 1)
    echo "step $(metric "$csv" time/step_s) s (generation $(metric "$csv" time/generation_s), scoring" \
        "$(metric "$csv" time/scoring_s), update $(metric "$csv" time/update_s)); $(metric "$csv" \
        train/generation/tokens_per_second) tok/s"
}

# The parts that run a script several times go on after a failed run (a failed variant or leg is marked in its table)
# and end with the status of the last run that failed.
score_variants() {  # bench_score.py as the layers are written, then (inductor compiles a while) compiled
    local code=0
    "$python" scripts/bench_score.py --device cuda --no-compiled || code=$?
    "$python" scripts/bench_score.py --device cuda --compiled --no-plain --variants padded packed-flex --dtypes bf16 \
        || code=$?
    return $code
}

bench_precisions() {  # bench_step.py in fp32, then with each side's GPU precision
    local precision code=0
    for precision in ${BENCH_PRECISIONS:-fp32 gpu}; do
        echo "## precision $precision"
        # shellcheck disable=SC2046,SC2086 - the cases are words; the flag is there or not
        "$python" scripts/bench_step.py --case ${BENCH_CASES:-smollm2 smollm2_long} --device cuda \
            --steps "${BENCH_STEPS:-4}" --legs ${BENCH_LEGS:-ours trl} $([ "$precision" = gpu ] && echo --gpu-precision) \
            || code=$?
    done
    return $code
}

equal_dtypes() {  # the static step's tokens against the eager loop's in fp32, then in fp64
    local dtype code=0
    for dtype in ${EQUAL_DTYPES:-float32 float64}; do
        echo "## $dtype"
        # shellcheck disable=SC2046,SC2086 - the compiled variants in fp32 only (the default on CUDA; fp64 settles
        # rounding); the variants and models are words
        "$python" scripts/bench_decode.py --device cuda --dtype "$dtype" --rows "${EQUAL_ROWS:-128}" --new-tokens 16 \
            --repeats 1 --variants ${EQUAL_VARIANTS:-eager static cuda-graph $([ "$dtype" = float32 ] && echo \
            reduce-overhead compiled-forward)} ${DECODE_MODELS:+--models $DECODE_MODELS} || code=$?
    done
    return $code
}

vllm_tests() {
    "$python" -c "import vllm" 2>/dev/null || { echo "vLLM is not installed"; return 77; }
    "$python" -m pytest -q tests/engines
}

export out steps new_tokens gsm8k python recipe no_checkpoints
export -f fit_recipe bench_precisions score_variants equal_dtypes vllm_tests

for part in "${parts[@]}"; do
    case "$part" in
    tests) run_part tests "grep -E '[0-9]+ (passed|failed)' $out/tests.log | tail -n 1" \
        "$python" -m pytest -q -p no:cacheprovider "${workers[@]}" --durations=10 tests/gpu ;;
    smollm2) run_part smollm2 "fit_figure smollm2" fit_recipe smollm2 "$steps" offline_smollm2 ;;
    qwen_fsdp2) run_part qwen_fsdp2 "fit_figure qwen_fsdp2" \
        fit_recipe qwen_fsdp2 "$((steps / 2))" offline_qwen2.5_1.5b_random fsdp2 ;;
    qwen_offload) run_part qwen_offload "fit_figure qwen_offload" \
        fit_recipe qwen_offload 3 offline_qwen2.5_1.5b_random fsdp2 cpu_offload ;;
    bench) run_part bench "awk '/^## precision/{p=\$3} /^== /{c=\$2} /^trl \\/ ours/{printf \"%s %s trl/ours %s; \", p, c, \$6}' $out/bench.log" \
        bench_precisions ;;
    static) run_part static "grep -E '[0-9]+ (passed|failed)' $out/static.log | tail -n 1" \
        "$python" -m pytest -q -p no:cacheprovider tests/gpu/test_static_decoding_cuda.py ;;
    decode) run_part decode "grep -E '^# best' $out/decode.log | sed 's/^# best: //' | tail -n 2 | tr '\n' ' '; grep -m 1 -o 'inductor skipped its CUDA graphs' $out/decode.log" \
        "$python" scripts/bench_decode.py --device cuda --rows ${DECODE_ROWS:-64 128} \
        ${DECODE_VARIANTS:+--variants $DECODE_VARIANTS} ${DECODE_MODELS:+--models $DECODE_MODELS} ;;
    equal) run_part equal "awk '/^## /{d=\$2} !/^#/ && \$(NF-3) == \"of\" {printf \"%s %s %s %s/%s (%s adjacent); \", d, \$1, \$3, \$(NF-4), \$(NF-2), \$(NF-1)}' $out/equal.log" \
        equal_dtypes ;;
    score) run_part score "grep -E '^# (fp32|bf16) forward' $out/score.log | sed 's/^# //' | tr '\n' ' '" \
        score_variants ;;
    vllm) run_part vllm "grep -E '[0-9]+ (passed|failed)|not installed' $out/vllm.log | tail -n 1" vllm_tests ;;
    *) echo "unknown part '$part'; the parts: tests smollm2 qwen_fsdp2 qwen_offload bench static decode equal score vllm" >&2; exit 2 ;;
    esac
done

echo
echo "GPU check ($(head -n 1 "$out/environment.txt"))" | tee "$out/summary.txt"
printf '%-13s %-18s %8s  %s\n' part status time figure | tee -a "$out/summary.txt"
printf '%s\n' "${rows[@]}" | tee -a "$out/summary.txt"
! printf '%s\n' "${rows[@]}" | grep -qE 'FAILED|timed out|not run'
