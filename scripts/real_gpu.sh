#!/usr/bin/env bash
# Real SGLang on an offline GPU box, in one command: install the releases from .whl-sglang/ (built
# elsewhere by `make wheelhouse-sglang`), record one run per fix the GPU count allows (`sglab real
# gpu`), check the recorded relations (`pytest -m gpu tests/sglang/test_gpu.py` on those runs),
# pack runs and logs.
#
#   bash scripts/real_gpu.sh [--dry-run]
#
# Environment: OUT (results folder; default real-gpu-out), FIXES (default: all, each skipped when it
# needs more GPUs than present), WHEELS (default .whl-sglang), RECORD_TIMEOUT (s, default 480: the
# record phase ends by then, steps that no longer fit recorded as not started, so that checks and
# packing still happen), TESTS=0 to skip the checks. Writes $OUT/real.tgz holding
# runs/real_<fix>/*.csv|json, the phase logs and summary.txt; prints the seconds of every phase.
# --dry-run: lists the phases and what `record` would run (GPUS=N plans for N GPUs), runs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-real-gpu-out}
WHEELS=${WHEELS:-.whl-sglang}
FIXES=${FIXES:-}
RECORD_TIMEOUT=${RECORD_TIMEOUT:-480}
TESTS=${TESTS:-1}
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TOKENIZERS_PARALLELISM=false
# a copy of the checkout without .git still names its commit in every manifest when SGLAB_GIT_SHA is
# given
sha=${SGLAB_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}
if [ -n "$sha" ]; then export SGLAB_GIT_SHA=$sha; fi
fix_args=()
if [ -n "$FIXES" ]; then read -ra fx <<< "$FIXES"; fix_args=(--fix "${fx[@]}"); fi

if [ "${1:-}" = "--dry-run" ]; then
  echo "phases: install ($WHEELS -> ${SGLAB_SGLANG_HOME:-.sglang}), env," \
       "record (cut at ${RECORD_TIMEOUT}s)," \
       "checks (TESTS=$TESTS), pack ($OUT/real.tgz)"
  gpus=$("$py" -c "import torch
print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" \
         2>/dev/null || echo 0)
  exec "$py" -m sglab.tools.cli real gpu --dry-run --gpus "${GPUS:-$gpus}" "${fix_args[@]}"
fi
if [ ! -d "$WHEELS" ]; then
  echo "error: $WHEELS not found: build it with \`make wheelhouse-sglang\`" \
       "and carry it to this machine" >&2
  exit 2
fi

mkdir -p "$OUT/logs"
runs=$(cd "$OUT" && pwd)/runs
summary=()
phase() {  # phase NAME CMD...: run, log to $OUT/logs/NAME.log, record rc and seconds
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > >(tee "$OUT/logs/$name.log") 2>&1
  local rc=$?
  local line="$name rc=$rc $((SECONDS - t0))s"
  summary+=("$line")
  echo "--- $line"
  return $rc
}
phase install bash scripts/install_sglang_gpu.sh "$WHEELS"
phase env "$py" -m sglab.tools.cli env
# --budget keeps every worker's timeout inside the phase; `timeout` is only the backstop
phase record timeout -k 10 "$RECORD_TIMEOUT" "$py" -m sglab.tools.cli real gpu --out "$runs" \
  --budget $((RECORD_TIMEOUT - 20)) "${fix_args[@]}"
if [ "$TESTS" != 0 ]; then
  phase checks env SGLAB_REAL_GPU_RUNS="$runs" \
    "$py" -m pytest -q -p no:cacheprovider -m gpu tests/sglang/test_gpu.py
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
t0=$SECONDS
tar czf "$OUT/real.tgz" -C "$OUT" summary.txt logs $( [ -d "$runs" ] && echo runs )
echo "packed $OUT/real.tgz ($(du -k "$OUT/real.tgz" | cut -f1) KiB) in $((SECONDS - t0))s"
! grep -q "rc=[1-9]" "$OUT/summary.txt"
