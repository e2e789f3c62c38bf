"""The GPU benchmark: ``python -m bhyt_pl.bench.gpu`` (or ``scripts/gpu_bench.sh``) on one CUDA GPU.

The same command as on the CPU, with the settings of the paper's model: ``llama-374m`` in bfloat16,
eager and compiled, sequences of 1024 tokens, the five schemes of the paper's comparison plus
BHyT*; norm sites at 32k tokens (at 4k a site is launch-bound) with the bandwidth roofline;
generation eager and compiled (static cache). Sized for about 5 minutes on an H100/H200-class GPU
with a cold inductor cache (``scripts/gpu_bench.sh`` adds the llama-1b step-memory part); extra
arguments are passed through (``--dry-run`` prints the settings without a GPU).
"""

from __future__ import annotations

import sys

from bhyt_pl.bench.command import main as bench_main

__all__ = ["GPU_ARGS", "main"]

GPU_ARGS = [
    "--device", "cuda",
    "--dtype", "bfloat16",
    "--compile",
    "--preset", "llama-374m",
    "--schemes", "rmsnorm", "rmsnorm:impl=reference", "bhyt", "bhyt:impl=reference", "bhyt_exact", "dyt", "peri_ln",
    "--seq-len", "1024",
    "--batch", "8",
    "--repeats", "7",
    "--site-dims", "1024,2048",
    "--site-tokens", "32768",
    "--gen-batch", "1",
    "--prompt-len", "128",
    "--new-tokens", "128",
    "--parts", "sites,train,generate,memory",
    "--threads", "8",
    "--json", "bench_gpu.json",
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return bench_main(GPU_ARGS + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
