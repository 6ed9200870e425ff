#!/usr/bin/env bash
# Build .whl-engine/ (git-ignored): per-release bundles that start a real SGLang engine on the GPU image
# (Python 3.12, torch 2.11.0+cu130, triton 3.6, transformers 5.17) offline, each small enough that two releases
# travel together in one 64 MiB carry. Layers (tar.xz of installed files, unpacked side by side on the GPU box by
# scripts/engine_gpu.sh; file selection: sglab.sglang.wheelhouse):
#   release-<V>.tar.xz        sglang <V> without its .so files, the slim sglang-kernel it pins (Python files,
#                             the sm90 build, the small op libraries), FlashInfer's Python files + the JIT
#                             sources of its norm kernel (FLASHINFER_FULL=1: the whole FlashInfer package)
#   transformers-<T>.tar.xz   the transformers the release pins (the image's 5.17 clashes with 0.5.1x's own
#                             AutoConfig registrations)
#   common.tar.xz             the light dependencies every release needs and the image lacks
#   bundles.json              {release: [layers]}
# Prints each layer's size and each pair of releases' total; exits 1 when a pair does not fit PAIR_LIMIT_MIB
# (default 56: the 64 MiB carry less the checkout).
# Usage: scripts/wheelhouse-engine.sh [DEST=.whl-engine]   (RELEASES="0.5.11 0.5.12.post1 0.5.13" by default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl-engine}
releases=${RELEASES:-0.5.11 0.5.12.post1 0.5.13}
py=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
wh() { "$py" -m sglab.sglang.wheelhouse "$@"; }
dl_dir="$dest/downloads"          # kept between builds: sglang-kernel wheels are ~320 MB each
mkdir -p "$dl_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
dl() { "$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 \
         --implementation cp --abi cp312 --abi abi3 --abi none "${plat[@]}" "$@" 2>&1 \
         | { grep -v "WARNING: Location" || true; }; }
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
whl() {  # whl NAME VERSION: the downloaded wheel's path (downloading it once)
  local f
  f=$(ls "$dl_dir"/$(echo "$1" | tr '-' '_')-"$2"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$f" ]; then
    dl --no-deps -d "$dl_dir" "$1==$2" >&2
    f=$(ls "$dl_dir"/$(echo "$1" | tr '-' '_')-"$2"-*.whl 2>/dev/null | head -1 || true)
    [ -n "$f" ] || { echo "error: no wheel of $1==$2" >&2; exit 1; }
  fi
  echo "$f"
}
declare -A have
while read -r name; do [ -n "$name" ] && have[$(norm "$name")]=1; done < <(grep -v '^#' scripts/gpu-image-packages.txt)
while read -r name; do [ -n "$name" ] && have[$(norm "$name")]=1; done < <(wh skip)

rm -f "$dest"/*.tar.xz "$dest"/bundles.json
declare -A plan tf_versions
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
  fi_kind=flashinfer; [ "${FLASHINFER_FULL:-0}" = 1 ] && fi_kind=flashinfer-full
  wh engine-layer "$dest/release-$v.tar.xz" "sglang:$sg" "kernel:$kern" "$fi_kind:$fi_whl"
  tf=${pin[transformers]}
  tf_versions[$tf]=1
  plan[$v]="release-$v.tar.xz transformers-$tf.tar.xz common.tar.xz"
  unset pin
done
for tf in "${!tf_versions[@]}"; do
  wh engine-layer "$dest/transformers-$tf.tar.xz" "plain:$(whl transformers "$tf")"
done
# common: the light dependencies, resolved for Python 3.12; what the image has is left out unless pinned here
mapfile -t reqs < <(wh engine-deps)
mapfile -t nodeps < <(wh engine-deps --no-deps)
# the transformers pins want tokenizers <= 0.23.0; the image has 0.23.2
tok=$(unzip -p "$(whl transformers "$(echo "${!tf_versions[@]}" | tr ' ' '\n' | sort -V | head -1)")" '*/METADATA' \
      | sed -n 's/^Requires-Dist: tokenizers\(.*\)$/tokenizers\1/p' | head -1 | tr -d ' ')
mkdir -p "$tmp/common"
dl -d "$tmp/common" "${reqs[@]}" "$tok"
dl --no-deps -d "$tmp/common" "${nodeps[@]}"
declare -A want=()
for r in "${reqs[@]}" "${nodeps[@]}" "$tok"; do
  name=$(norm "$(echo "$r" | sed 's/[<>=!~;].*//')")
  case "$r" in *==*|*'<'*) want[$name]=1 ;; esac   # pinned or capped: kept even where the image has one
done
keep=()
for w in "$tmp/common"/*.whl; do
  name=$(norm "$(basename "$w" | cut -d- -f1)")
  case "$name" in torch|triton|numpy|nvidia-*|transformers) continue ;; esac
  if [ -n "${have[$name]:-}" ] && [ -z "${want[$name]:-}" ]; then continue; fi
  keep+=("$w")
done
echo "common: ${#keep[@]} wheels: $(for w in "${keep[@]}"; do basename "$w" | cut -d- -f1-2; done | tr '\n' ' ')"
wh engine-layer "$dest/common.tar.xz" $(for w in "${keep[@]}"; do printf 'plain:%s ' "$w"; done)
{
  echo "{"
  first=1
  for v in $releases; do
    [ $first = 1 ] || echo ","
    first=0
    printf '  "%s": [%s]' "$v" "$(for f in ${plan[$v]}; do printf '"%s",' "$f"; done | sed 's/,$//')"
  done
  echo
  echo "}"
} > "$dest/bundles.json"
wh engine-check "$dest" --pair-limit "${PAIR_LIMIT_MIB:-56}"
