#!/usr/bin/env bash
# Build .whl-engine/ (git-ignored): per-release bundles that start a real SGLang engine on the GPU
# image (Python 3.12, torch 2.11.0+cu130, triton 3.6, transformers 5.17) offline, each release's
# layers under LIMIT_MIB (40 MiB, scripts/engine_bundle.py). Layers are tar.xz of installed files,
# unpacked side by side on the GPU box by scripts/engine_gpu.sh (file selection:
# scripts/engine_bundle.py):
#   release-<V>.tar.xz       sglang <V> without its .so files, the slim sglang-kernel it pins
#                            (Python files, the sm90 build, the small op libraries), FlashInfer's
#                            Python files and its norm kernel's JIT sources (FLASHINFER_FULL=1:
#                            all of FlashInfer)
#   transformers-<T>.tar.xz  the transformers the release pins (the image's 5.17 clashes with the
#                            AutoConfig registrations of 0.5.1x)
#   common.tar.xz            the light dependencies every release needs and the image lacks
#   bundles.json             {release: [layers]}
# Prints each layer's size, each release's and each pair's total; exits 1 when a release does not
# fit LIMIT_MIB (default 40, small enough to copy with the checkout). Downloads stay in
# DEST/downloads.
# Usage: scripts/wheelhouse-engine.sh [DEST=.whl-engine]
#        (RELEASES="0.5.11 0.5.12.post1 0.5.13" by default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl-engine}
releases=${RELEASES:-0.5.11 0.5.12.post1 0.5.13}
py=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
wh() { "$py" scripts/engine_bundle.py "$@"; }
dl_dir="$dest/downloads"          # kept between builds: sglang-kernel wheels are ~320 MB each
mkdir -p "$dl_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
dl() {
  "$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none "${plat[@]}" "$@" 2>&1 \
    | { grep -v "WARNING: Location" || true; }
}
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
whl() {  # whl NAME VERSION: the downloaded wheel's path (downloaded once)
  local f stem
  stem=$(echo "$1" | tr '-' '_')
  f=$(ls "$dl_dir/$stem-$2"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$f" ]; then
    dl --no-deps -d "$dl_dir" "$1==$2" >&2
    f=$(ls "$dl_dir/$stem-$2"-*.whl 2>/dev/null | head -1 || true)
    [ -n "$f" ] || { echo "error: no wheel of $1==$2" >&2; exit 1; }
  fi
  echo "$f"
}
declare -A have
while read -r name; do
  [ -n "$name" ] && have[$(norm "$name")]=1
done < <(grep -v '^#' scripts/gpu-image-packages.txt; wh skip)

rm -f "$dest"/*.tar.xz "$dest"/bundles.json
declare -A tf_versions
plan="{}"
for v in $releases; do
  sg=$(whl sglang "$v")
  declare -A pin=()
  while IFS='=' read -r k val; do pin[$k]=$val; done < <(wh engine-pins "$sg" | sed 's/==/=/')
  for k in torch sglang-kernel flashinfer-python transformers; do
    [ -n "${pin[$k]:-}" ] || { echo "error: sglang $v pins no $k" >&2; exit 1; }
  done
  echo "sglang $v pins: torch ${pin[torch]}, sglang-kernel ${pin[sglang-kernel]}," \
       "flashinfer-python ${pin[flashinfer-python]}, transformers ${pin[transformers]}"
  kern=$(whl sglang-kernel "${pin[sglang-kernel]}")
  fi_whl=$(whl flashinfer-python "${pin[flashinfer-python]}")
  fi_kind=flashinfer
  if [ "${FLASHINFER_FULL:-0}" = 1 ]; then fi_kind=flashinfer-full; fi
  wh engine-layer "$dest/release-$v.tar.xz" "sglang:$sg" "kernel:$kern" "$fi_kind:$fi_whl"
  tf=${pin[transformers]}
  tf_versions[$tf]=1
  plan=$("$py" -c 'import json, sys; p = json.loads(sys.argv[1]); p[sys.argv[2]] = sys.argv[3:];
print(json.dumps(p))' "$plan" "$v" "release-$v.tar.xz" "transformers-$tf.tar.xz" common.tar.xz)
  unset pin
done
for tf in "${!tf_versions[@]}"; do
  wh engine-layer "$dest/transformers-$tf.tar.xz" "plain:$(whl transformers "$tf")"
done
# common: the light dependencies resolved for Python 3.12; what the image has is left out unless
# pinned or capped here. The transformers pins want tokenizers <= 0.23.0; the image has 0.23.2.
mapfile -t reqs < <(wh engine-deps)
mapfile -t nodeps < <(wh engine-deps --no-deps)
oldest_tf=$(printf '%s\n' "${!tf_versions[@]}" | sort -V | head -1)
tok=$(unzip -p "$(whl transformers "$oldest_tf")" '*/METADATA' \
      | sed -n 's/^Requires-Dist: tokenizers\(.*\)$/tokenizers\1/p' | head -1 | tr -d ' ')
mkdir -p "$tmp/common"
dl -d "$tmp/common" "${reqs[@]}" "$tok"
dl --no-deps -d "$tmp/common" "${nodeps[@]}"
declare -A want=()
for r in "${reqs[@]}" "${nodeps[@]}" "$tok"; do
  name=$(norm "$(echo "$r" | sed 's/[<>=!~;].*//')")
  case "$r" in *==*|*'<'*) want[$name]=1 ;; esac
done
parts=() names=()
for w in "$tmp/common"/*.whl; do
  name=$(norm "$(basename "$w" | cut -d- -f1)")
  case "$name" in torch|triton|numpy|nvidia-*|transformers) continue ;; esac
  if [ -n "${have[$name]:-}" ] && [ -z "${want[$name]:-}" ]; then continue; fi
  parts+=("plain:$w")
  names+=("$(basename "$w" | cut -d- -f1-2)")
done
echo "common: ${#parts[@]} wheels: ${names[*]}"
wh engine-layer "$dest/common.tar.xz" "${parts[@]}"
echo "$plan" > "$dest/bundles.json"
wh engine-check "$dest" --limit "${LIMIT_MIB:-40}"
