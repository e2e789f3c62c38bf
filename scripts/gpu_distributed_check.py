"""GPU check for the distributed paths (prepared; run it whenever CUDA GPUs are available).

1. The chunked loss under FSDP2: ``Llama.forward(idx, labels=...)`` against the plain loss of full
   logits on the same sharded model and batch (the printed difference should be ~1e-3 in bf16).
2. MFU of the training step for ``llama-374m`` and ``llama-1b`` (``--mfu-presets``): rmsnorm, FSDP2,
   bf16 parameters, compiled blocks, the loss inside the model's forward (chunked, or liger-kernel when
   installed), ``--mfu-batch`` x ``--mfu-seq-len`` tokens per GPU. Target: >= 45 % at llama-1b on one H200.
3. A few training steps of ``llama-374m`` with each norm scheme under bf16 mixed precision with FSDP1
   (FullyShardedDataParallel, per-Block units) and FSDP2 (fully_shard per block, then the root), eager
   and with ``torch.compile`` per block; prints tokens/s, MFU and peak memory per configuration.

    torchrun --standalone --nproc_per_node $(nvidia-smi -L | wc -l) scripts/gpu_distributed_check.py
    # on this CPU, to check the script itself (FSDP2 only; FSDP1 refuses CPU):
    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/gpu_distributed_check.py \
        --device cpu --preset tiny --seq-len 128 --batch 2 --steps 2 --compile-schemes none

Stays under 8 minutes on one H200 with the defaults: parts 1-2 take about 2 minutes, part 3 stops at
--budget-minutes (6.5, counted from the start; a row takes well under a minute), skipping what is left and saying so.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bhyt_pl import Llama, LlamaConfig, parameter_groups
from bhyt_pl.callbacks.throughput import peak_flops_for
from bhyt_pl.flops import training_flops_per_token
from bhyt_pl.loss import resolve_impl
from bhyt_pl.model import Block
from bhyt_pl.parallelize import shard_model
from bhyt_pl.run_config import build_run_config
from bhyt_pl.run_facts import build_run_facts

SCHEMES = ["rmsnorm", "layernorm", "dyt", "bhyt", "bhyt_exact", "peri_ln", "lns"]


def model_config(
    args, norm: str, preset: str | None = None, seq_len: int | None = None, batch: int | None = None
) -> LlamaConfig:
    """The preset with ``norm``, built by ``build_run_config`` with the run facts of this run's settings
    (``build_run_facts``; BHyT's T: the sequence length)."""
    facts = build_run_facts(seq_len=seq_len or args.seq_len, batch_size=batch or args.batch)
    return build_run_config(preset or args.preset, norm, run_facts=facts)


def build(args, norm: str, strategy: str, compiled: bool, device: torch.device, preset: str | None = None):
    seq_len, batch = (args.seq_len, args.batch) if preset is None else (args.mfu_seq_len, args.mfu_batch)
    config = model_config(args, norm, preset, seq_len, batch)
    bf16 = device.type == "cuda"
    if strategy == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = Llama(config).to(device)
        if compiled:
            for layer in model.layers:
                layer.compile()
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        model = FullyShardedDataParallel(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            mixed_precision=mp,
            use_orig_params=True,
            device_id=device,
        )
    else:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        with torch.device("meta"):
            model = Llama(config)
        if compiled:
            for layer in model.layers:
                layer.compile()
        if bf16:
            shard_model(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            shard_model(model, mesh)
        model.to_empty(device=device)
        model.reset_parameters()
    return model, config


def measure(
    args,
    norm: str,
    strategy: str,
    compiled: bool,
    device: torch.device,
    peak: float | None,
    preset: str | None = None,
) -> dict:
    """Tokens/s, MFU and peak memory of ``args.steps`` AdamW steps; ``preset`` selects the MFU shapes."""
    torch.manual_seed(0)
    batch, seq_len = (args.batch, args.seq_len) if preset is None else (args.mfu_batch, args.mfu_seq_len)
    model, config = build(args, norm, strategy, compiled, device, preset)
    opt = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len + 1), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step(model, opt) -> torch.Tensor:
        loss = model(ids[:, :-1], labels=ids[:, 1:]).loss  # the training path: the loss inside forward
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step(model, opt)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step(model, opt)
    sync()
    elapsed = time.perf_counter() - start
    tokens = batch * seq_len * args.steps * dist.get_world_size()
    flops = tokens * training_flops_per_token(config, seq_len)
    result = {
        "tokens_per_sec": tokens / elapsed,
        "mfu": flops / elapsed / (peak * dist.get_world_size()) if peak else float("nan"),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
        "loss": float(loss.detach()),
    }
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def loss_check(args, device: torch.device) -> float:
    """Largest |chunked - plain| loss of one FSDP2-sharded model on one batch (both inside the root's forward)."""
    torch.manual_seed(0)
    model, config = build(args, "rmsnorm", "fsdp2", False, device)
    ids = torch.randint(0, config.vocab_size, (2, min(args.seq_len, 512) + 1), device=device)
    with torch.no_grad():
        chunked = model(ids[:, :-1], labels=ids[:, 1:]).loss
        model.loss_impl = "plain"
        plain = model(ids[:, :-1], labels=ids[:, 1:]).loss
        reference = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())
    del model
    return max(abs(float(chunked - plain)), abs(float(chunked - reference)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="llama-374m")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="sequences per GPU")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--strategies", default="fsdp1,fsdp2")
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--compile-schemes", default="rmsnorm,bhyt", help="also compiled for these ('none': no compile)")
    p.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak per GPU (default: from the table)")
    p.add_argument("--budget-minutes", type=float, default=6.5, help="start no new row of part 3 after this")
    p.add_argument("--mfu-presets", default="llama-374m,llama-1b", help="MFU rows (rmsnorm, FSDP2, compiled); 'none'")
    p.add_argument("--mfu-batch", type=int, default=8, help="sequences per GPU of the MFU rows")
    p.add_argument("--mfu-seq-len", type=int, default=2048, help="tokens per sequence of the MFU rows")
    args = p.parse_args()

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank()
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        peak = (
            args.peak_tflops * 1e12
            if args.peak_tflops
            else peak_flops_for(torch.cuda.get_device_name(device), torch.bfloat16)
        )
    else:
        device, peak = torch.device("cpu"), (args.peak_tflops * 1e12 if args.peak_tflops else None)
    say = functools.partial(print, flush=True) if rank == 0 else (lambda *a, **k: None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    say(
        f"# {args.preset}, {dist.get_world_size()} x {name}, batch {args.batch} x {args.seq_len} per device, "
        f"bf16={device.type == 'cuda'}, torch {torch.__version__}, "
        f"peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s"
    )
    deadline = time.monotonic() + args.budget_minutes * 60
    say(f"loss implementation (loss_impl='auto'): {resolve_impl('auto', device)}")
    say(f"chunked loss under FSDP2 vs the plain loss of full logits: |difference| = {loss_check(args, device):.2e}")
    if args.mfu_presets != "none":
        say("\n| MFU: preset | batch x seq per GPU | tokens/s | MFU | peak GiB | loss |  (target >= 45 % at llama-1b)")
        say("|---|---|---|---|---|---|")
        for preset in args.mfu_presets.split(","):
            r = measure(args, "rmsnorm", "fsdp2", device.type == "cuda", device, peak, preset=preset)
            say(
                f"| {preset} | {args.mfu_batch} x {args.mfu_seq_len} | {r['tokens_per_sec']:,.0f} | {r['mfu']:.1%} | "
                f"{r['peak_mem_gib']:.1f} | {r['loss']:.3f} |"
            )
    say("\n| strategy | scheme | compile | tokens/s | MFU | peak GiB | loss |")
    say("|---|---|---|---|---|---|---|")
    compiled_for = set() if args.compile_schemes == "none" else set(args.compile_schemes.split(","))
    for strategy in args.strategies.split(","):
        for norm in args.schemes.split(","):
            for compiled in (False, True) if norm in compiled_for else (False,):
                if time.monotonic() > deadline:
                    say(f"| {strategy} | {norm} | {compiled} | skipped: --budget-minutes reached | | | |")
                    continue
                r = measure(args, norm, strategy, compiled, device, peak)
                say(
                    f"| {strategy} | {norm} | {compiled} | {r['tokens_per_sec']:,.0f} | {r['mfu']:.1%} | "
                    f"{r['peak_mem_gib']:.1f} | {r['loss']:.3f} |"
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
