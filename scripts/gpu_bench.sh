#!/usr/bin/env bash
# The GPU benchmark (docs/performance.md) on one CUDA GPU, in three timed parts that fit 10.5 minutes together:
#   1. step peak memory at llama-1b, bf16 (chunked cross-entropy vs the plain loss vs transformers, each in
#      its own process; CUDA peak allocated bytes), <= 150 s   -> bench_gpu_memory.json
#   2. llama-374m, bf16, eager and compiled: norm sites (32k tokens, roofline against 4.8/3.35 TB/s and a
#      measured copy), training step vs transformers (and litgpt when installed), generation eager and
#      compiled (static cache), saved activations, <= 330 s      -> bench_gpu.json
#   3. the ratio parts in bf16: both pre-norm sites at d = 2048, 32k tokens (BHyT's default path, which on
#      CUDA is the plain ops, and its eager Function, impl=fused, vs RMSNorm's), whole generate calls of small and llama-374m cut to 2 layers, ours compiled and eager vs
#      transformers, with the profile split, <= 150 s                                 -> bench_gpu_ratios.json
# MFU at llama-374m and llama-1b is measured by scripts/gpu_distributed_check.py.
# Usage: scripts/gpu_bench.sh [extra arguments for part 2]
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/inductor}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible')" || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
rc=0
timeout 150 "$PY" -m bhyt_pl bench --device cuda --dtype bfloat16 --parts step_memory \
  --mem-preset llama-1b --mem-layers 16 --mem-batch 4 --mem-seq-len 2048 --json bench_gpu_memory.json || rc=$?
timeout 330 "$PY" -m bhyt_pl.bench.gpu "$@" || rc=$?
timeout 150 "$PY" -m bhyt_pl bench --device cuda --dtype bfloat16 --threads 8 --parts prenorm,decode \
  --schemes rmsnorm bhyt bhyt:impl=fused --site-dims 2048 --site-tokens 32768 \
  --decode-sizes small,llama-374m:2 --prompt-len 128 --new-tokens 128 --repeats 7 --json bench_gpu_ratios.json || rc=$?
exit "$rc"
