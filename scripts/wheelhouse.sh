#!/usr/bin/env bash
# Build a wheelhouse for an offline GPU box: Python 3.12, manylinux x86_64 wheels of what a
# torch-only CUDA image lacks (scripts/wheelhouse-requirements.txt, with their dependencies), minus
# what the image already has (scripts/gpu-image-packages.txt). Usage: scripts/wheelhouse.sh
# [DEST=.whl]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_25_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  plat+=(--platform "$p")
done
"$py" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 \
  --abi none "${plat[@]}" -d "$tmp" -r scripts/wheelhouse-requirements.txt
mkdir -p "$dest"
rm -f "$dest"/*.whl
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
declare -A have want
while read -r name; do
  [ -n "$name" ] && have[$(norm "$name")]=1
done < <(grep -v '^#' scripts/gpu-image-packages.txt)
# asked for by name (usually for a newer version than the image's): always kept
while read -r req; do
  [ -n "$req" ] && want[$(norm "${req%%[=<>~ ]*}")]=1
done < <(grep -v '^#' scripts/wheelhouse-requirements.txt)
kept=0; dropped=0
for whl in "$tmp"/*.whl; do
  base=$(basename "$whl")
  name=$(norm "${base%%-*}")
  if [ -n "${have[$name]:-}" ] && [ -z "${want[$name]:-}" ]; then
    dropped=$((dropped + 1))
  else
    cp "$whl" "$dest/"; kept=$((kept + 1))
  fi
done
size=$(du -sm "$dest" | cut -f1)
echo "wheelhouse $dest: $kept wheels, ${size} MiB ($dropped dropped: already on the GPU image)"
if [ "$size" -gt 64 ]; then echo "warning: over 64 MiB" >&2; fi
