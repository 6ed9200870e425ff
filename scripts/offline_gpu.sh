#!/usr/bin/env bash
# Run the workbook on an offline GPU box from the wheelhouse (.whl/, built by `make wheelhouse`
# elsewhere): install the wheels into a private folder, print the environment, run the GPU tests,
# record experiments, execute the notebooks live, and pack everything into one tarball.
#
#   WHEELS=.whl OUT=offline-out TESTS="-m gpu" \
#     RECORD="swa_loc pcg_gate workspace_floor:world_size=2" NOTEBOOKS="" scripts/offline_gpu.sh
#
# RECORD: experiments to record, one after the other (never concurrently: several experiments are
# bound by host launch overhead, and a neighbour process on the same host disturbs them), each EXP
# or EXP:key=value,key=value. NOTEBOOKS: names for `sglab run` (empty: all; "none": skip). TESTS:
# pytest arguments ("none": skip). Every step runs even if one before it failed; the summary and the
# exit code say which failed.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-offline-out}
TESTS=${TESTS:--m gpu}
RECORD=${RECORD:-}
NOTEBOOKS=${NOTEBOOKS:-}
SITE=${SITE:-/tmp/sglab-site}
py=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# a copy of the checkout without .git can still name its commit in every run manifest
export SGLAB_GIT_SHA=${SGLAB_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}
summary=()
step() {  # step NAME CMD...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > >(tee "$OUT/$name.log") 2>&1
  local rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s")
  return $rc
}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  step install "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl
fi
export PYTHONPATH="$SITE:$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
# data files of the wheels (nbconvert's HTML templates, the kernelspec) land in $SITE/share/jupyter
# with --target
export JUPYTER_PATH="$SITE/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
step env "$py" -m sglab.tools.cli env
if [ "$TESTS" != none ]; then
  # shellcheck disable=SC2086
  step tests "$py" -m pytest -q -p no:cacheprovider $TESTS --junitxml="$OUT/junit.xml"
fi
for spec in $RECORD; do
  exp=${spec%%:*}; args=()
  if [ "$spec" != "$exp" ]; then
    IFS=, read -ra kv <<< "${spec#*:}"
    for p in "${kv[@]}"; do args+=(--param "$p"); done
  fi
  step "record-${spec//[:=,]/_}" "$py" -m sglab.tools.cli record "$exp" "${args[@]}"
done
if [ "$NOTEBOOKS" != none ]; then
  # shellcheck disable=SC2086
  step notebooks "$py" -m sglab.tools.cli run $NOTEBOOKS --out "$OUT/reports" --timings
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
tar czf "$OUT/sglab-results.tgz" -C "$OUT" --exclude sglab-results.tgz . \
  -C "$PWD" data/runs 2>/dev/null
echo "packed $OUT/sglab-results.tgz"
! grep -q "rc=[1-9]" "$OUT/summary.txt"
