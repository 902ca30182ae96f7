#!/usr/bin/env bash
# What scripts/gpu_check.sh needs on a GPU machine without network, gathered here into one folder (default .gpu,
# which git ignores; gpu_check.sh reads it from the repository's root):
#   wheels/   the packages a CUDA image that already holds torch, lightning, torchmetrics, transformers (5.4 or
#             newer), huggingface_hub, tokenizers, accelerate, peft, numpy, pandas, pyarrow, pyyaml, rich and pytest
#             lacks: rlvr_lightning's jsonargparse and math grader, TRL for `bench`; installed there without their
#             dependencies, ahead of the image's own packages
#   cache/    SmolLM2-135M-Instruct's config and tokenizer, no weights (gpu_check.sh gives it random weights)
#   gsm8k/    train.jsonl and test.jsonl from GSM8K_DIR (default ../shared/data/gsm8k), where they exist
#
#   bash scripts/gpu_bundle.sh                        # wheels for the machine's Python 3.12
#   PYTHON_VERSION=3.11 bash scripts/gpu_bundle.sh /tmp/bundle
#
# Versions: constraints.txt's (those the published figures were measured with), TRL as pyproject's `bench`
# extra pins it, and datasets 5.0.0 rather than constraints.txt's 5.2 (5.2 needs pyarrow 24, 5.0 pyarrow 21).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.gpu}"
python="${PYTHON:-python3}"
packages=(jsonargparse docstring_parser typeshed_client math-verify latex2sympy2_extended antlr4-python3-runtime
    dill multiprocess)
pinned=("trl==$(sed -n 's/.*"trl==\([^"]*\)".*/\1/p' pyproject.toml)" "datasets==5.0.0")
for name in "${packages[@]}"; do
    line=$(grep -i "^${name}==" constraints.txt) || { echo "constraints.txt pins no $name" >&2; exit 1; }
    pinned+=("$line")
done
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do platforms+=(--platform "$tag"); done
rm -rf "$out/wheels"
mkdir -p "$out/wheels"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
    --implementation cp "${platforms[@]}" -d "$out/wheels" "${pinned[@]}"

smollm2=$("$python" -m rlvr_lightning.runtime.model_cache path smollm2-135m-instruct)
target="$out/cache/models/smollm2-135m-instruct"
mkdir -p "$target"
find "$smollm2" -maxdepth 1 -type f ! -name '*.safetensors' ! -name '*.gguf' ! -name '*.bin' -exec cp {} "$target" \;
[ -f "$target/config.json" ] || echo "no SmolLM2 config in $smollm2: run rlvr-models fetch smollm2-135m-instruct" >&2

gsm8k="${GSM8K_DIR:-../shared/data/gsm8k}"
if [ -f "$gsm8k/train.jsonl" ] && [ -f "$gsm8k/test.jsonl" ]; then
    mkdir -p "$out/gsm8k"
    cp "$gsm8k/train.jsonl" "$gsm8k/test.jsonl" "$out/gsm8k/"
fi
find "$out" -type f | sort
du -sh "$out"
