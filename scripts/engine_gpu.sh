#!/usr/bin/env bash
# Real SGLang engines on a GPU box, from the engine bundles (built elsewhere by
# `make wheelhouse-engine`): each release's layers are unpacked into its own temporary folder
# ($ENGINE_HOME/<V>/site; never into the image's site-packages, whose torch, triton and numpy stay
# the ones used), then `sglab engine` runs what is asked, one invocation per scenario, each engine
# in its own process group with a timeout.
#
#   bash scripts/engine_gpu.sh --scenario 01-kimi-pcg [--scenario NAME ...] [--release V ...]
#   bash scripts/engine_gpu.sh --plan 01                 every scenario of notebook 01
#   bash scripts/engine_gpu.sh --scenario 01-llama-width --cases 'w512-*' 'w1024-*'
#                                                        only those cases (a long scenario split
#                                                        over calls: each records its own run)
#   bash scripts/engine_gpu.sh --scenario 01-kimi-pcg --cpus auto
#                                                        each engine on the CPUs local to GPU 0
#   bash scripts/engine_gpu.sh -- --release 0.5.13 --model data/models/llama_32x512/config.json
#   bash scripts/engine_gpu.sh --dry-run --plan 04       unpack nothing (no bundles needed), print
#                                                        the commands; a release neither unpacked
#                                                        by an earlier run nor under .sglang/ says
#                                                        so instead of its command
#   bash scripts/engine_gpu.sh --verify --plan 04        `sglab verify --live --against` on the
#                                                        plan's engine experiments (their runs go
#                                                        back in engine.tgz too)
#   bash scripts/engine_gpu.sh --verify --scenario 01-kimi-pcg --release 0.5.13
#                                                        the scenario, then `sglab verify RUN
#                                                        --against` on what it recorded (a rerun
#                                                        of a plan one call at a time)
#
# Environment: PYTHON (default python3: the GPU image's, with numpy, pandas and psutil), OUT
# (default engine-gpu-out), BUNDLES (default .whl-engine; jit-cache*.tar.xz there are unpacked
# into $HOME first), PROBE=1 (run `python -m sglab.core.hostprobe` first; its file
# comes back in runs/host_probe/, named as data/recorded keeps it), PACK_JIT=1 (pack the JIT
# caches into $OUT/jit-cache.tar.xz for the next fresh machine), ENGINE_HOME (default
# /tmp/sglab-engine-home), RELEASES (releases to unpack; default every one of bundles.json whose
# layers are here). The JIT caches (FlashInfer's norm kernel, SGLang's tvm-ffi kernels, Triton)
# stay in $HOME/.cache and $HOME/.triton between engine starts: the first capture on a fresh
# machine takes 66-90 s, later ones about 2 s. Writes $OUT/engine.tgz (runs/engine_<fix>/; the
# engines of a scenario a signal cut short in runs/partial/engine_<fix>/; logs/,
# summary.txt; rewritten after every step) and $OUT/summary.txt. ENGINE_TIMEOUT caps each engine.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-engine-gpu-out}
BUNDLES=${BUNDLES:-.whl-engine}
ENGINE_HOME=${ENGINE_HOME:-/tmp/sglab-engine-home}
# model folders and engine logs (outside $OUT: few files come back)
WORK=${WORK:-/tmp/sglab-engine-work}
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}" SGLAB_ENGINE_HOME="$ENGINE_HOME"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TOKENIZERS_PARALLELISM=false
sha=${SGLAB_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}
# a tree with uncommitted changes says so in every manifest
if [ -z "${SGLAB_GIT_SHA:-}" ] && [ -n "$sha" ] \
   && [ -n "$(git status --porcelain -uno 2>/dev/null)" ]; then
  sha="$sha+dirty"
fi
if [ -n "$sha" ]; then export SGLAB_GIT_SHA=$sha; fi

scenarios=() releases=() cases=() free=() dry=0 plan="" verify=0 cpus=""
needs_value() {  # needs_value FLAG [NEXT]: exit 2 where FLAG has no value (nothing, or a flag next)
  if [ $# -lt 2 ] || [ "${2#--}" != "$2" ]; then
    echo "engine_gpu.sh: $1 needs a value (e.g. $1 ${examples[$1]}; see the header of $0)" >&2
    exit 2
  fi
}
declare -A examples=([--scenario]=01-kimi-pcg [--plan]=03 [--release]=0.5.13 [--cpus]=auto
                     [--cases]="'w512-*'")
while [ $# -gt 0 ]; do
  case "$1" in
    --scenario|--plan|--release|--cpus|--cases) needs_value "$@" ;;&
    --scenario) scenarios+=("$2"); shift 2 ;;
    --plan) plan=$2; shift 2 ;;
    --release) releases+=("$2"); shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --cases) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do cases+=("$1"); shift; done ;;
    --dry-run) dry=1; shift ;;
    --verify) verify=1; shift ;;
    --) shift; free=("$@"); break ;;
    *) echo "engine_gpu.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
# what the harness imports beside the standard library (the GPU image's python3 has it all)
if ! missing=$("$py" -c 'import importlib.util as u
print(" ".join(m for m in ("numpy", "pandas", "psutil") if u.find_spec(m) is None))' 2>/dev/null)
then
  echo "engine_gpu.sh: $py does not run (PYTHON names the interpreter; default python3)" >&2
  exit 2
elif [ -n "$missing" ]; then
  echo "engine_gpu.sh: $py lacks $missing (pip install $missing, or PYTHON=.venv/bin/python)" >&2
  exit 2
fi
rel_args=()
for v in "${releases[@]}"; do rel_args+=(--release "$v"); done
if [ ${#cases[@]} -gt 0 ]; then rel_args+=(--cases "${cases[@]}"); fi
if [ -n "$cpus" ]; then rel_args+=(--cpus "$cpus"); fi

if [ ! -f "$BUNDLES/bundles.json" ] && [ $dry = 1 ]; then
  # a dry run unpacks nothing: the bundles are not read
  echo "engine_gpu.sh: no $BUNDLES/bundles.json: a dry run needs none, a real run needs the" \
       "bundles (\`make wheelhouse-engine\`)"
elif [ ! -f "$BUNDLES/bundles.json" ]; then
  echo "engine_gpu.sh: $BUNDLES/bundles.json not found (build the bundles with" \
       "\`make wheelhouse-engine\` and copy bundles.json, common.tar.xz and the release-<V> and" \
       "transformers-<T> layers)" >&2
  exit 2
fi
layers_of() {  # layers_of V: the layer files of release V, from bundles.json
  "$py" -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))[sys.argv[2]]))' \
    "$BUNDLES/bundles.json" "$1"
}
unpack() {  # unpack V: its layers into $ENGINE_HOME/V/site, once
  local v=$1 site=$ENGINE_HOME/$1/site layers f t0=$SECONDS
  layers=$(layers_of "$v")
  for f in $layers; do
    [ -f "$BUNDLES/$f" ] || { echo "skip sglang $v: $BUNDLES/$f not carried"; return 1; }
  done
  if [ -f "$site/.sglab-layers" ] && [ "$(cat "$site/.sglab-layers")" = "$layers" ]; then
    echo "sglang $v: already unpacked in $site"; return 0
  fi
  rm -rf "$site.tmp"; mkdir -p "$site.tmp"
  for f in $layers; do tar -xJf "$BUNDLES/$f" -C "$site.tmp" || return 1; done
  echo "$layers" > "$site.tmp/.sglab-layers"
  rm -rf "$site"; mv "$site.tmp" "$site"
  echo "sglang $v: unpacked $(echo "$layers" | wc -w) layers into $site in $((SECONDS - t0)) s"
}

# a dry run writes nothing under $OUT: its commands' output goes to a folder of its own, removed
# on exit
logs="$OUT/logs"
if [ $dry = 1 ]; then
  logs=$(mktemp -d "${TMPDIR:-/tmp}/engine-gpu-dry.XXXXXX")
  trap 'rm -rf "$logs"' EXIT
else
  mkdir -p "$OUT/logs" "$OUT/runs" "$HOME/.cache"
fi
summary=()
if [ $dry = 0 ]; then
  all=$("$py" -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))))' \
        "$BUNDLES/bundles.json")
  for v in ${RELEASES:-$all}; do unpack "$v"; done
  # JIT caches of an earlier GPU run (PACK_JIT=1 writes them): the first capture then skips its
  # kernel builds (minutes per release on a fresh machine)
  for f in "$BUNDLES"/jit-cache*.tar.xz; do
    [ -f "$f" ] && tar -xJf "$f" -C "$HOME" && echo "JIT cache: unpacked $f into $HOME"
  done
  "$py" -c 'import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "GPUs", torch.cuda.device_count())'
  # PROBE=1: the host probe first (about 60 s): whether this machine's vCPUs change speed between
  # rounds, beside the engine runs it returns with (runs/host_probe/, as data/recorded keeps them)
  if [ "${PROBE:-0}" = 1 ]; then
    "$py" -m sglab.core.hostprobe --out "$OUT/runs/host_probe/" --fresh 3 --rounds 3 \
      || echo "host probe failed (the engine runs go on)"
  fi
fi

step() {  # step NAME ARGS...: one `sglab engine` invocation, its output in logs/NAME.log
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== $name: sglab engine $*"
  sg "$logs/$name.log" engine "$@"
  rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s")
  echo "--- $name rc=$rc $((SECONDS - t0))s"
  [ $dry = 1 ] || pack  # after every step: a call cut short still brings back what ran
}
pack() {  # the command logs, every engine's log (gzipped) and the runs so far -> $OUT/engine.tgz
  for d in "$WORK"/*/; do
    [ -f "$d/engine.log" ] || continue
    gzip -c "$d/engine.log" > "$OUT/logs/$(basename "$d" | tr '+' '_').engine.log.gz"
  done
  printf '%s\n' "${summary[@]}" > "$OUT/summary.txt"
  tar czf "$OUT/engine.tgz.tmp" -C "$OUT" summary.txt logs runs \
    && mv "$OUT/engine.tgz.tmp" "$OUT/engine.tgz"
}
pack_jit() {  # PACK_JIT=1: the JIT caches, for the next fresh machine (also after a signal)
  [ "${PACK_JIT:-0}" = 1 ] || return 0
  local jit
  jit=$(cd "$HOME" && ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null)
  [ -n "$jit" ] || { echo "JIT cache: none under $HOME"; return 0; }
  du -sh $(printf "$HOME/%s " $jit) 2>/dev/null
  XZ_OPT="-T0 -3" tar -cJf "$OUT/jit-cache.tar.xz.tmp" -C "$HOME" $jit &&
    mv "$OUT/jit-cache.tar.xz.tmp" "$OUT/jit-cache.tar.xz" &&
    echo "JIT cache: $OUT/jit-cache.tar.xz ($(du -k "$OUT/jit-cache.tar.xz" | cut -f1) KiB)"
}
# Ended by a signal (an outer timeout, Ctrl-C): the running `sglab` stops its engine's whole
# process group before it exits (sglab.core.procs), and this script waits for it, packs what ran
# and exits; were this script killed outright, that `sglab` still finishes and stops its engine.
child=0 tailer=0
on_signal() {
  trap '' TERM INT HUP
  echo "engine_gpu.sh: $1: stopping the running engine" >&2
  if [ "$child" -gt 0 ]; then kill -TERM "$child" 2>/dev/null; wait "$child"; fi
  if [ "$tailer" -gt 0 ]; then wait "$tailer" 2>/dev/null; fi
  summary+=("stopped by $1")
  [ $dry = 1 ] || { pack; pack_jit; }
  exit 143
}
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
trap 'on_signal SIGHUP' HUP
sg() {  # sg LOG ARGS...: `sglab ARGS` in the background (so a signal reaches the trap at once)
  local log=$1 rc
  shift
  # `sglab` writes its log itself and a `tail` echoes it here: `timeout` signals this script's
  # whole process group, and the echo may go first without losing a line of the log
  : > "$log"
  "$py" -m sglab.tools.cli "$@" > "$log" 2>&1 &
  child=$!
  tail -n +1 -s 0.2 -f --pid="$child" "$log" &
  tailer=$!
  wait "$child"
  rc=$?
  child=0
  wait "$tailer" 2>/dev/null
  tailer=0
  return $rc
}

common=(--record --out "$OUT/runs" --work "$WORK")
if [ -n "${ENGINE_TIMEOUT:-}" ]; then common+=(--timeout "$ENGINE_TIMEOUT"); fi
if [ $dry = 1 ]; then common=(--dry-run); fi
if [ -n "$plan" ]; then
  # a scenario needing more GPUs than this machine has is skipped with one line (a dry run lists
  # all)
  mapfile -t more < <("$py" -c 'import sys
from sglab.core import hardware
from sglab.tools import fixes
gpus = None if sys.argv[2] == "1" else (hardware.gpu_count() if hardware.has_cuda() else 0)
picked, skipped = fixes.plan_for(sys.argv[1], gpus)
print("\n".join(skipped), file=sys.stderr) if skipped else None
print("\n".join(s.name for s in picked))' "$plan" "$dry")
  scenarios+=("${more[@]}")
fi
verify_runs=0  # --verify with named scenarios: verify what they record, after them
if [ $verify = 1 ] && [ -z "$plan" ] && [ ${#scenarios[@]} -gt 0 ]; then verify_runs=1 verify=0; fi
if [ $verify = 1 ]; then
  # the plan's (or every) engine experiment with claims, run live and compared with the record
  mapfile -t exps < <("$py" -c 'import sys; from sglab.tools import fixes
checked = [e for e in fixes.experiments() if e.startswith("engine_")]
picked = {s.experiment for s in fixes.plan(sys.argv[1])} if sys.argv[1] else set(checked)
print("\n".join(e for e in checked if e in picked))' "$plan")
  if [ -z "${exps[0]:-}" ]; then
    echo "engine_gpu.sh: no engine experiment with claims in plan $plan" >&2; exit 2
  fi
  echo "=== verify: sglab verify --live --against ${exps[*]}"
  if [ $dry = 1 ]; then exit 0; fi
  t0=$SECONDS
  sg "$logs/verify.log" verify --live --against "${exps[@]}"
  rc=$?
  summary+=("verify rc=$rc $((SECONDS - t0))s")
  for e in "${exps[@]}"; do
    [ -d "data/runs/$e" ] && mkdir -p "$OUT/runs/$e" && cp data/runs/"$e"/* "$OUT/runs/$e/"
  done
  scenarios=()
fi
for s in "${scenarios[@]}"; do step "$s" --scenario "$s" "${rel_args[@]}" "${common[@]}"; done
if [ ${#free[@]} -gt 0 ]; then step engine "${common[@]}" "${free[@]}"; fi
if [ $verify_runs = 1 ]; then
  echo "=== verify: sglab verify RUN --against on the runs recorded above"
  if [ $dry = 1 ]; then exit 0; fi
  mapfile -t recorded < <(ls "$OUT"/runs/engine_*/*.csv 2>/dev/null)
  if [ -n "${recorded[0]:-}" ]; then
    t0=$SECONDS
    sg "$logs/verify.log" verify "${recorded[@]}" --against
    rc=$?
  else
    t0=$SECONDS rc=2
    echo "engine_gpu.sh: the scenarios recorded no run to verify" >&2
  fi
  summary+=("verify rc=$rc $((SECONDS - t0))s")
fi
if [ $dry = 1 ]; then exit 0; fi

# one archive and the summary (at most 8 files come back from a GPU box)
pack
pack_jit
cat "$OUT/summary.txt"
rm -rf "$WORK" "$OUT/logs" "$OUT/runs"
echo "packed $OUT/engine.tgz ($(du -k "$OUT/engine.tgz" | cut -f1) KiB)"
! grep -q "rc=[1-9]" "$OUT/summary.txt"
