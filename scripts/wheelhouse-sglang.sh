#!/usr/bin/env bash
# Build .whl-sglang/ (git-ignored): what the GPU image (Python 3.12, torch 2.11+cu130, triton,
# transformers, torchvision; scripts/gpu-image-packages.txt) lacks to run SGLang 0.5.11,
# 0.5.12.post1 and 0.5.23 offline:
#   releases/sglang-<V>-cp312-*.whl   the release wheels, repacked without what srt never imports
#                                     (releases.REPACK_DROP: Rust extensions, multimodal_gen)
#   deps/<set>/*.whl                  light dependencies per set (lists: sglab.sglang.releases)
#   deps/common/*.whl                 the ones both sets need, once
# Run where PyPI is reachable; install on the GPU box with scripts/install_sglang_gpu.sh.
# Usage: scripts/wheelhouse-sglang.sh [DEST=.whl-sglang]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl-sglang}
py=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
dl() { "$py" -m pip download -q --disable-pip-version-check --only-binary=:all: \
         --python-version 3.12 \
         --implementation cp --abi cp312 --abi abi3 --abi none "${plat[@]}" "$@"; }
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
declare -A have
while read -r name; do
  [ -n "$name" ] && have[$(norm "$name")]=1
done < <(grep -v '^#' scripts/gpu-image-packages.txt)
# left out on purpose (sglab.sglang.releases.GPU_WHEEL_SKIP says why): treated as if the image had
# them
while read -r name; do
  [ -n "$name" ] && have[$(norm "$name")]=1
done < <("$py" -m sglab.sglang.wheelhouse skip)

rm -rf "$dest"; mkdir -p "$dest/releases"
for v in $("$py" -m sglab.sglang.wheelhouse releases); do
  dl --no-deps -d "$dest/releases" "sglang==$v"
done
for whl in "$dest"/releases/sglang-*.whl; do
  "$py" -m sglab.sglang.wheelhouse repack "$whl"
done
for set in 0.5.1x 0.5.2x; do
  mkdir -p "$tmp/$set" "$dest/deps/$set"
  mapfile -t reqs < <("$py" -m sglab.sglang.wheelhouse requirements "$set")
  mapfile -t nodeps < <("$py" -m sglab.sglang.wheelhouse requirements "$set" --no-deps)
  dl -d "$tmp/$set" "${reqs[@]}"
  dl --no-deps -d "$tmp/$set" "${nodeps[@]}"
  declare -A want=()
  for r in "${reqs[@]}" "${nodeps[@]}"; do
    # pinned: kept even where the image has one
    case "$r" in *==*) want[$(norm "${r%%==*}")]=1 ;; esac
  done
  for whl in "$tmp/$set"/*.whl; do
    name=$(norm "$(basename "$whl" | cut -d- -f1)")
    # the image's own copy is used, unless the requirement pins a version
    if [ -n "${have[$name]:-}" ] && [ -z "${want[$name]:-}" ]; then continue; fi
    cp "$whl" "$dest/deps/$set/"
  done
  unset want
done
# wheels both sets need, once: deps/common/ (the installer adds it to every set)
mkdir -p "$dest/deps/common"
for whl in "$dest"/deps/0.5.1x/*.whl; do
  b=$(basename "$whl")
  if [ -e "$dest/deps/0.5.2x/$b" ]; then
    mv "$whl" "$dest/deps/common/"; rm "$dest/deps/0.5.2x/$b"
  fi
done
ls "$dest"/releases "$dest"/deps/* | sed 's/^/  /'
size=$(du -sm "$dest" | cut -f1)
echo "wheelhouse $dest: $(find "$dest" -name '*.whl' | wc -l) wheels, ${size} MiB"
if [ "$size" -gt 40 ]; then echo "warning: over 40 MiB" >&2; fi
