#!/usr/bin/env bash
# The GPU benchmark (docs/performance.md): llama-374m, bf16, eager and compiled, on one CUDA GPU.
# Usage: scripts/gpu_bench.sh [extra bench arguments]; prints the markdown table, writes bench_gpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/inductor}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible')"
exec timeout 480 "$PY" -m bhyt_pl.bench.gpu "$@"
