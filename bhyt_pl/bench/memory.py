"""Memory: activations saved for backward (exact, from saved-tensor hooks), and the peak growth of a
whole training step's forward and backward, each side in its own process.

Saved activations: each storage is counted once (a tensor saved by two ops costs its memory once)
and parameters are not activations, so their storages are left out. Device-independent, and
deterministic, unlike an allocator's peak on a CPU.

Step peak: what the loss costs at the paper's vocabulary. ``step_peak_memory`` starts one process
per side, because a process's peak resident size only grows and glibc keeps some freed memory.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from bhyt_pl.loss import resolve_impl

__all__ = ["STEP_SIDES", "measure_step_peak", "saved_activation_bytes", "step_peak_memory"]


def saved_activation_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages saved for backward while ``fn()`` runs, minus ``exclude``'s.

    Saved tensors stay referenced until ``fn``'s result is dropped, so the count is the activation
    memory held at the end of the forward pass: the peak of a training step before backward starts.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and ptr != 0:
            seen[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


# ----------------------------------------------------------------------------- peak memory of a step
STEP_SIDES = ("chunked", "plain", "hf_transformers")
"""Who is measured: ours with the loss inside the model (``loss_impl="auto"``: chunked, or liger on CUDA
when installed), ours with the plain loss of full float32 logits, and transformers' own ``labels`` loss."""


def _rss_bytes(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, from /proc (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        f.write("5")


def measure_step_peak(spec: dict[str, Any]) -> dict[str, Any]:
    """In this process: build one side, preallocate its gradients, then grow memory by exactly one
    forward and backward (no optimizer step) and return the growth of the peak.

    CPU: peak resident set size (``VmHWM``, reset right before the step) minus the resident size before it.
    CUDA: ``torch.cuda.max_memory_allocated`` minus the allocated bytes before the step.
    """
    from bhyt_pl.bench.models import build_model, hf_peer
    from bhyt_pl.variants import parse_variant

    torch.set_num_threads(spec["threads"])
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    side, B, T = spec["side"], spec["batch"], spec["seq_len"]
    model = build_model(spec["preset"], parse_variant("rmsnorm"), spec["overrides"], device, dtype, T, B)
    vocab = model.config.vocab_size
    impl = "plain" if side == "plain" else "auto"
    model.loss_impl = impl
    model.loss_chunk_tokens = spec.get("loss_chunk_tokens")
    resolved = resolve_impl(impl, device)
    if side == "hf_transformers":
        model = hf_peer(model).train()
        resolved = "transformers ForCausalLMLoss"
    model.train()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    gen = torch.Generator(device="cpu").manual_seed(0)
    idx = torch.randint(0, vocab, (B, T + 1), generator=gen).to(device)
    inputs, targets = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    def step() -> torch.Tensor:
        if side == "hf_transformers":  # transformers shifts the labels itself
            loss = model(input_ids=idx[:, :-1], labels=idx[:, :-1]).loss
        else:
            loss = model(inputs, labels=targets).loss
        loss.backward()
        return loss.detach()

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss = step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        before = _rss_bytes("VmRSS")
        _reset_peak_rss()
        loss = step()
        peak = _rss_bytes("VmHWM")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "side": side,
        "loss_impl": resolved,
        "peak_growth_bytes": peak - before,
        "before_bytes": before,
        "parameter_bytes": params,
        "loss": float(loss),
    }


def step_peak_memory(
    sides: Iterable[str],
    preset: str,
    overrides: dict[str, Any],
    batch: int,
    seq_len: int,
    dtype: str,
    device: str,
    threads: int,
) -> dict[str, dict[str, Any]]:
    """``measure_step_peak`` for each side, each in a fresh Python process (so one side's freed memory,
    allocator caches and imports cannot lower or raise another's figure)."""
    out = {}
    for side in sides:
        if side not in STEP_SIDES:
            raise ValueError(f"unknown step-memory side {side!r}; sides: {', '.join(STEP_SIDES)}")
        spec = {
            "side": side,
            "preset": preset,
            "overrides": overrides,
            "batch": batch,
            "seq_len": seq_len,
            "dtype": dtype,
            "device": device,
            "threads": threads,
        }
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"step-memory child for {side!r} failed:\n{proc.stderr[-4000:]}")
        out[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


_CHILD = (
    "import json, sys; from bhyt_pl.bench.memory import measure_step_peak as m; "
    "print(json.dumps(m(json.loads(sys.argv[1]))))"
)
