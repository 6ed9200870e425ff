#!/usr/bin/env bash
# On an offline GPU box: lay the releases in .whl-sglang/ (built by `make wheelhouse-sglang`) out as
# .sglang/releases/<V>/ and their light dependencies as .sglang/deps/<set>/, offline, without
# touching the image's torch, triton or transformers. Then `python -m sglab.tools.cli env` lists
# them and the shims they need. Usage: scripts/install_sglang_gpu.sh [WHEELHOUSE=.whl-sglang]
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${1:-.whl-sglang}
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
mapfile -t releases < <("$py" -m sglab.sglang.wheelhouse releases)
"$py" -m sglab.sglang.install --wheelhouse "$wheels" --releases "${releases[@]}"
