"""``python -m bhyt_pl bench``: norm sites, training step, generation and memory of every scheme,
side by side with Hugging Face ``transformers``, in one interleaved run (docs/performance.md)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from bhyt_pl.bench.decode import parse_size, profile_generate
from bhyt_pl.bench.generation import generation_fns
from bhyt_pl.bench.memory import STEP_SIDES, saved_activation_bytes, step_peak_memory
from bhyt_pl.bench.models import build_model, compile_blocks, hf_peer, litgpt_available, litgpt_peer
from bhyt_pl.bench.prenorm import prenorm_step
from bhyt_pl.bench.report import PAPER, markdown, ratio_markdown, throughput_entries, time_entries
from bhyt_pl.bench.sites import block_norms, memory_bandwidth, site_bytes, site_step
from bhyt_pl.bench.study_run import study_run_markdown, study_run_table
from bhyt_pl.bench.tanh import tanh_table
from bhyt_pl.bench.timing import interleaved, median, paired_ratio, synchronizer
from bhyt_pl.bench.train_step import train_step
from bhyt_pl.machine import machine_info
from bhyt_pl.variants import DEFAULT_VARIANTS, Variant, parse_variant

__all__ = ["DEFAULT_PARTS", "PARTS", "PEER", "main", "parser", "run"]

log = logging.getLogger(__name__)

PARTS = ("sites", "tanh", "train", "generate", "memory", "step_memory", "prenorm", "train_ratio", "decode", "study_run")
DEFAULT_PARTS = PARTS[:6]
"""What a bare ``bench`` runs; ``prenorm``, ``train_ratio``, ``decode`` and ``study_run`` are asked for by name."""
BASELINE = "rmsnorm"
"""The variant every run includes and the ratios divide by; the transformers and litgpt peers are built from it."""
STUDY_RUN_SCHEMES = (BASELINE, "bhyt")
"""The schemes ``--parts study_run`` times by default: the study's cost claim is about these two."""

PEER = "hf_transformers"
LITGPT = "litgpt"
"""The optional training-step peer (litgpt's ``GPT``), timed when litgpt is installed."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUICK = {
    "preset": "tiny",
    "overrides": {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 128, "vocab_size": 256},
    "seq_len": 32,
    "batch": 2,
    "site_dims": [64],
    "site_tokens": 128,
    "prompt_len": 8,
    "new_tokens": 4,
    "repeats": 2,
    "mem_preset": "tiny",
    "mem_overrides": {"n_layers": 1, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 128, "vocab_size": 4096},
    "mem_batch": 2,
    "mem_seq_len": 64,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bhyt_pl bench",
        allow_abbrev=False,  # a shortened flag is an error, never read as the flag it starts
        description="Time every norm scheme (norm sites, training step, KV-cache generation, activation memory) "
        "against rmsnorm and Hugging Face transformers in one interleaved run; print a markdown table, write JSON.",
    )
    p.add_argument("--preset", default="small", help="model preset for the training step and generation")
    p.add_argument(
        "--schemes",
        nargs="+",
        default=list(DEFAULT_VARIANTS),
        help="schemes, each name[:key=value,...] (e.g. bhyt:impl=fused); rmsnorm is added first if missing",
    )
    p.add_argument("--seq-len", type=int, default=256, help="training sequence length")
    p.add_argument("--batch", type=int, default=4, help="training batch size")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help="also time compiled")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repetitions per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadiest on a shared CPU)")
    p.add_argument("--site-dims", default="1024,2048", help="widths of the norm-site benchmark")
    p.add_argument(
        "--site-tokens",
        type=int,
        default=None,
        help="tokens per norm-site call (default 4096 on CPU, 32768 on CUDA, where 4096 is launch-bound)",
    )
    p.add_argument("--gen-batch", type=int, default=1, help="generation batch size")
    p.add_argument("--prompt-len", type=int, default=64, help="generation prompt length")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt")
    p.add_argument("--mem-preset", default="llama-374m", help="step_memory: model preset (paper vocabulary 128256)")
    p.add_argument("--mem-layers", type=int, default=2, help="step_memory: the preset cut to this many layers")
    p.add_argument("--mem-batch", type=int, default=2, help="step_memory: sequences per step")
    p.add_argument("--mem-seq-len", type=int, default=1024, help="step_memory: tokens per sequence")
    p.add_argument(
        "--decode-sizes",
        default="tiny,small,llama-374m:2",
        help="decode: presets (preset:n_layers cuts one) whose whole generate call is timed and profiled",
    )
    p.add_argument("--study-steps", type=int, default=None, help="study_run: steps per run (default: the study's, 180)")
    p.add_argument("--study-repeats", type=int, default=2, help="study_run: runs per scheme and path")
    p.add_argument(
        "--study-schemes",
        nargs="+",
        default=list(STUDY_RUN_SCHEMES),
        help="study_run: the registered schemes whose one study run is timed eager and compiled",
    )
    p.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"subset of {','.join(PARTS)} (default: the first six)",
    )
    p.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="include transformers (and litgpt in the training step, when installed)",
    )
    p.add_argument("--json", type=Path, default=Path("bench_results.json"), help="where to write the JSON")
    p.add_argument("--quick", action="store_true", help="tiny sizes and 2 repetitions (smoke test)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved settings and exit")
    return p


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    variants = [parse_variant(t) for t in args.schemes]
    if not any(v.label == BASELINE for v in variants):
        variants.insert(0, parse_variant(BASELINE))
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    settings = {
        "preset": args.preset,
        "overrides": {},
        "schemes": [v.label for v in variants],
        "seq_len": args.seq_len,
        "batch": args.batch,
        "dtype": args.dtype,
        "device": args.device,
        "compile": args.compile,
        "repeats": args.repeats,
        "threads": args.threads,
        "site_dims": [int(d) for d in args.site_dims.split(",")],
        "site_tokens": args.site_tokens or (32768 if args.device.startswith("cuda") else 4096),
        "gen_batch": args.gen_batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "parts": parts,
        "peers": args.peers,
        "mem_preset": args.mem_preset,
        "mem_overrides": {"n_layers": args.mem_layers},
        "mem_batch": args.mem_batch,
        "mem_seq_len": args.mem_seq_len,
        "study_steps": args.study_steps,
        "study_repeats": args.study_repeats,
        "study_schemes": args.study_schemes,
        "decode_sizes": [t for t in args.decode_sizes.split(",") if t],
        "attn_implementation": "sdpa (torch.nn.functional.scaled_dot_product_attention) in both",
        "compile_path": "torch.compile of each block in place (Block.compile(dynamic=False)); generation: "
        "Llama.generate(compile=True), one compiled decode step over a static cache",
        "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    }
    if args.quick:
        settings.update(QUICK)
    for size in settings["decode_sizes"]:
        parse_size(size)
    if settings["new_tokens"] < 2:
        raise ValueError(f"--new-tokens must be >= 2 (one prefill plus decode steps), got {settings['new_tokens']}")
    return settings


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bhyt_pl bench``; returns the exit status."""
    args = parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ValueError as err:
        parser().error(str(err))
    if args.dry_run:
        print(json.dumps(settings, indent=2))
        return 0
    results = run(settings)
    if set(settings["parts"]) & set(DEFAULT_PARTS):
        print(markdown(results))
    print(ratio_markdown(results))
    if "study_run" in results:
        print(study_run_markdown(results["study_run"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


def run(settings: dict[str, Any]) -> dict[str, Any]:
    """Run the parts named in ``settings`` and return the results dict (see docs/performance.md)."""
    device = torch.device(settings["device"])
    dtype = DTYPES[settings["dtype"]]
    threads = torch.get_num_threads()
    dynamo = torch._dynamo.config
    limits = {k: getattr(dynamo, k) for k in ("recompile_limit", "cache_size_limit") if hasattr(dynamo, k)}
    try:
        torch.set_num_threads(settings["threads"])
        if "study_run" in settings["parts"]:  # first, with the study's own dynamo limits
            study = study_run_table(settings["study_schemes"], settings["study_steps"], settings["study_repeats"])
            if settings["parts"] == ["study_run"]:
                return {"machine": machine_info(torch.device("cpu")), "settings": settings, "study_run": study}
        for k in limits:  # one compiled graph per scheme and shape: far more than the default 8
            setattr(dynamo, k, 512)
        results = _run(settings, device, dtype)
        if "study_run" in settings["parts"]:
            results["study_run"] = study
        return results
    finally:
        torch.set_num_threads(threads)
        for k, v in limits.items():
            setattr(dynamo, k, v)


def _modes(settings: dict[str, Any]) -> dict[str, bool]:
    return {"eager": False, "compiled": True} if settings["compile"] else {"eager": False}


def _run(settings: dict[str, Any], device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    variants = [parse_variant(label) for label in settings["schemes"]]
    sync = synchronizer(device)
    results: dict[str, Any] = {"machine": machine_info(device), "settings": settings}
    parts = settings["parts"]
    if "sites" in parts or "memory" in parts:
        _sites(results, variants, settings, device, dtype, sync)
    if "tanh" in parts and device.type == "cpu":
        shape = (8, 256, 256)
        results["tanh"] = {"shape": list(shape), "formulations": tanh_table(shape, settings["repeats"], False)}
        if settings["compile"]:
            compiled = tanh_table(shape, settings["repeats"], True)
            for name, row in compiled.items():
                results["tanh"]["formulations"][name]["compiled_ms"] = row["compiled_ms"]
    if "train" in parts or "memory" in parts:
        _train(results, variants, settings, device, dtype, sync)
    if "generate" in parts:
        _generate(results, variants, settings, device, dtype, sync)
    if "prenorm" in parts:
        _prenorm(results, variants, settings, device, dtype, sync)
    if "train_ratio" in parts:
        _train_ratio(results, variants, settings, device, dtype, sync)
    if "decode" in parts:
        _decode(results, variants, settings, device, dtype, sync)
    if "step_memory" in parts:
        sides = STEP_SIDES if settings["peers"] else STEP_SIDES[:2]
        results["step_memory"] = step_peak_memory(
            sides,
            settings["mem_preset"],
            settings["mem_overrides"],
            settings["mem_batch"],
            settings["mem_seq_len"],
            settings["dtype"],
            settings["device"],
            settings["threads"],
        )
    results["summary"] = _summary(results)
    return results


def _sites(results, variants: list[Variant], settings, device, dtype, sync) -> None:
    timed = "sites" in settings["parts"]
    if timed:
        results["bandwidth"] = memory_bandwidth(device)
    for dim in settings["site_dims"]:
        key = f"d{dim}"
        for mode, use_compile in _modes(settings).items():
            steps, site_norms = {}, {}
            for v in variants:
                norms = block_norms(v, dim, 16, device, dtype, settings["seq_len"], settings["batch"])
                site_norms[v.label] = norms
                step, forward = site_step(norms, settings["site_tokens"], use_compile, device, dtype, dim)
                steps[v.label] = step
                if "memory" in settings["parts"] and dim == settings["site_dims"][0]:
                    step()  # compile first, so the count sees the compiled graph's saved tensors
                    nbytes = saved_activation_bytes(forward, norms.parameters())
                    results.setdefault("memory", {}).setdefault(v.label, {})[f"sites_{key}_{mode}"] = nbytes
            if timed:
                samples = interleaved(steps, settings["repeats"], warmup=1, sync=sync)
                entries = time_entries(samples)
                for label, entry in entries.items():  # the roofline: compulsory bytes over time
                    entry["bytes"] = site_bytes(site_norms[label], settings["site_tokens"], dim, dtype)
                    entry["bytes_per_s"] = entry["bytes"] / entry["median_s"]
                    for ref, bw in results["bandwidth"].items():
                        entry[f"fraction_of_{ref}_bandwidth"] = entry["bytes_per_s"] / bw if bw else None
                results.setdefault("sites", {}).setdefault(key, {})[mode] = entries


def _train(results, variants: list[Variant], settings, device, dtype, sync) -> None:
    B, T = settings["batch"], settings["seq_len"]
    timed = "train" in settings["parts"]
    for mode, use_compile in _modes(settings).items():
        steps = {}
        for v in variants:
            model = build_model(settings["preset"], v, settings["overrides"], device, dtype, T, B)
            if use_compile:
                compile_blocks(model)
            step, forward_loss = train_step(model, B, T, model.config.vocab_size, post_step=model.constrain_weights)
            steps[v.label] = step
            if "memory" in settings["parts"]:
                step()
                nbytes = saved_activation_bytes(forward_loss, model.parameters())
                results.setdefault("memory", {}).setdefault(v.label, {})[f"train_step_{mode}"] = nbytes
            if settings["peers"] and v.label == BASELINE and not use_compile:
                hf = hf_peer(model)
                steps[PEER], _ = train_step(hf, B, T, model.config.vocab_size, hf=True)
            if settings["peers"] and v.label == BASELINE and litgpt_available():
                peer = litgpt_peer(model, compile=use_compile)
                steps[LITGPT], _ = train_step(peer, B, T, model.config.vocab_size)
        if timed:
            samples = interleaved(steps, settings["repeats"], warmup=1, sync=sync)
            medians = {n: median(s) for n, s in samples.items()}
            results.setdefault("train_step", {})[mode] = throughput_entries(medians, B * T, samples)


def _prenorm(results, variants: list[Variant], settings, device, dtype, sync) -> None:
    """``prenorm``: both pre-norm sites of a block per scheme (BHyT's Function saving its tanh is the variant
    ``bhyt:save_tanh=true``)."""
    for dim in settings["site_dims"]:
        steps = {}
        for v in variants:
            norms = block_norms(v, dim, 16, device, dtype, settings["seq_len"], settings["batch"])
            steps[v.label] = prenorm_step(norms, settings["site_tokens"], dim, device, dtype)
        samples = interleaved(steps, settings["repeats"], warmup=1, sync=sync)
        results.setdefault("prenorm", {})[f"d{dim}"] = {
            "tokens": settings["site_tokens"],
            "samples_s": samples,
            "median_ms": {n: median(s) * 1e3 for n, s in samples.items()},
            "time_vs_rmsnorm": {n: paired_ratio(s, samples[BASELINE]) for n, s in samples.items()},
        }


def _train_ratio(results, variants: list[Variant], settings, device, dtype, sync) -> None:
    """``train_ratio``: the training step of every scheme, eager and compiled, all in one interleaved
    loop, with each scheme's tokens/s over rmsnorm's per repetition (median and interval)."""
    B, T = settings["batch"], settings["seq_len"]
    steps = {}
    for mode, use_compile in _modes(settings).items():
        for v in variants:
            model = build_model(settings["preset"], v, settings["overrides"], device, dtype, T, B)
            if use_compile:
                compile_blocks(model)
            steps[f"{mode}/{v.label}"], _ = train_step(
                model, B, T, model.config.vocab_size, post_step=model.constrain_weights
            )
    samples = interleaved(steps, settings["repeats"], warmup=1, sync=sync)
    ratios = {}
    for name, s in samples.items():
        mode, label = name.split("/", 1)
        if label != BASELINE:  # tokens/s ratio = rmsnorm's time / this scheme's time, per repetition
            ratios[f"{mode}: {label} / rmsnorm tokens/s"] = paired_ratio(samples[f"{mode}/{BASELINE}"], s)
    results["train_ratio"] = {
        "tokens_per_step": B * T,
        "samples_s": samples,
        "tokens_per_s": {n: B * T / median(s) for n, s in samples.items()},
        "ratios": ratios,
    }


def _decode(results, variants: list[Variant], settings, device, dtype, sync) -> None:
    """``decode``: whole greedy ``generate`` calls at each size, ours compiled (rmsnorm, bhyt; not with
    ``--no-compile``), ours eager (rmsnorm) and transformers (``--peers``), interleaved; then one profiled
    call of each (where the time goes)."""
    B, P, N = settings["gen_batch"], settings["prompt_len"], settings["new_tokens"]
    schemes = [v for v in variants if v.label in COMPILED_GENERATION]
    for size in settings["decode_sizes"]:
        preset, overrides = parse_size(size)
        calls, compile_s = {}, {}
        for v in schemes:
            model = build_model(preset, v, overrides, device, dtype, settings["seq_len"], settings["batch"])
            if settings["compile"]:
                _, generate = generation_fns(model, B, P, N, model.config.vocab_size, compile=True)
                calls[f"compiled/{v.label}"] = generate
                sync()
                start = time.perf_counter()
                generate()  # compiles the decode step
                sync()
                compile_s[v.label] = time.perf_counter() - start
            if v.label == BASELINE:
                _, calls[f"eager/{BASELINE}"] = generation_fns(model, B, P, N, model.config.vocab_size)
                if settings["peers"]:
                    hf = hf_peer(model)
                    _, calls[PEER] = generation_fns(hf, B, P, N, model.config.vocab_size, hf=True)
        samples = interleaved(calls, settings["repeats"], warmup=1, sync=sync)
        entry: dict[str, Any] = {
            "preset": preset,
            "overrides": overrides,
            "samples_s": samples,
            "median_ms": {n: median(s) * 1e3 for n, s in samples.items()},
            "compile_s": {n: t - median(samples[f"compiled/{n}"]) for n, t in compile_s.items()},
        }
        if PEER in samples:  # speed-up over transformers: its time / ours, per repetition
            entry["vs_transformers"] = {n: paired_ratio(samples[PEER], s) for n, s in samples.items() if n != PEER}
            profiled = [n for n in (f"compiled/{BASELINE}", f"eager/{BASELINE}", PEER) if n in calls]
            entry["profile"] = {n: profile_generate(calls[n]) for n in profiled}
            ours = f"compiled/{BASELINE}"
            if ours in entry["profile"]:  # ours' matmul share of its median call: robust to load between calls
                floor = entry["profile"][ours]["matmul_fraction"] * median(samples[ours])
                entry["bound_vs_transformers"] = median(samples[PEER]) / floor if floor else None
        results.setdefault("decode", {})[size] = entry


COMPILED_GENERATION = ("rmsnorm", "bhyt")
"""Schemes whose compiled decoding is timed (each compiles its own graph, tens of seconds on a CPU)."""


def _generate(results, variants: list[Variant], settings, device, dtype, sync) -> None:
    B, P, N = settings["gen_batch"], settings["prompt_len"], settings["new_tokens"]
    for mode, use_compile in _modes(settings).items():
        prefill, generate, compile_s = {}, {}, {}
        for v in variants:
            if use_compile and v.label not in COMPILED_GENERATION:
                continue
            model = build_model(
                settings["preset"], v, settings["overrides"], device, dtype, settings["seq_len"], settings["batch"]
            )
            prefill[v.label], generate[v.label] = generation_fns(
                model, B, P, N, model.config.vocab_size, compile=use_compile
            )
            if use_compile:  # the first call compiles; its excess over a warm call is the compile time
                sync()
                start = time.perf_counter()
                generate[v.label]()
                sync()
                compile_s[v.label] = time.perf_counter() - start
            if settings["peers"] and v.label == BASELINE and not use_compile:
                hf = hf_peer(model)
                prefill[PEER], generate[PEER] = generation_fns(hf, B, P, N, model.config.vocab_size, hf=True)
        if not generate:
            continue
        candidates = {f"prefill/{n}": f for n, f in prefill.items()} | {f"generate/{n}": f for n, f in generate.items()}
        samples = interleaved(candidates, settings["repeats"], warmup=1, sync=sync)
        t_prefill = {n: median(samples[f"prefill/{n}"]) for n in prefill}
        t_decode = {n: median(samples[f"generate/{n}"]) - t_prefill[n] for n in generate}
        entry = {
            "prefill": throughput_entries(t_prefill, B * P, {n: samples[f"prefill/{n}"] for n in prefill}),
            "decode": throughput_entries(t_decode, B * (N - 1), {n: samples[f"generate/{n}"] for n in generate}),
        }
        if compile_s:
            entry["compile_s"] = {n: t - median(samples[f"generate/{n}"]) for n, t in compile_s.items()}
        results.setdefault("generation", {})[mode] = entry


def _summary(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """The headline comparisons of the benchmark, each ours next to the paper's where it published one."""
    out: dict[str, dict[str, float | None]] = {}

    def ratio(section: dict, a: str, b: str, field: str) -> float | None:
        if a in section and b in section:
            return section[a][field] / section[b][field]
        return None

    for mode, entries in results.get("train_step", {}).items():
        out[f"train {mode}: bhyt / rmsnorm tokens/s"] = {
            "ours": ratio(entries, "bhyt", BASELINE, "tokens_per_s"),
            "paper": PAPER["train_bhyt_vs_rmsnorm"],
        }
        out[f"train {mode}: bhyt / bhyt_exact tokens/s"] = {
            "ours": ratio(entries, "bhyt", "bhyt_exact", "tokens_per_s"),
            "paper": PAPER["train_bhyt_vs_bhyt_exact"],
        }
        peer = results["train_step"]["eager"]
        if PEER in peer and BASELINE in entries:
            out[f"train {mode}: ours rmsnorm / transformers eager tokens/s"] = {
                "ours": entries[BASELINE]["tokens_per_s"] / peer[PEER]["tokens_per_s"],
                "paper": None,
            }
        if LITGPT in entries and BASELINE in entries:
            out[f"train {mode}: ours rmsnorm / litgpt {mode} tokens/s"] = {
                "ours": entries[BASELINE]["tokens_per_s"] / entries[LITGPT]["tokens_per_s"],
                "paper": None,
            }
    for key, by_mode in results.get("sites", {}).items():
        for mode, entries in by_mode.items():
            out[f"sites {key} {mode}: bhyt_exact / bhyt time"] = {
                "ours": ratio(entries, "bhyt_exact", "bhyt", "median_s"),
                "paper": PAPER["train_bhyt_vs_bhyt_exact"],
            }
            out[f"sites {key} {mode}: bhyt / dyt time"] = {"ours": ratio(entries, "bhyt", "dyt", "median_s")}
            out[f"sites {key} {mode}: bhyt / rmsnorm time"] = {"ours": ratio(entries, "bhyt", BASELINE, "median_s")}
    for mode, parts in results.get("generation", {}).items():
        dec = parts["decode"]
        out[f"decode {mode}: bhyt / rmsnorm tokens/s"] = {
            "ours": ratio(dec, "bhyt", BASELINE, "tokens_per_s"),
            "paper": PAPER["generate_bhyt_vs_rmsnorm"],
        }
        out[f"decode {mode}: bhyt / peri_ln tokens/s"] = {
            "ours": ratio(dec, "bhyt", "peri_ln", "tokens_per_s"),
            "paper": PAPER["generate_bhyt_vs_peri_ln"],
        }
        peer = results["generation"].get("eager", {}).get("decode", {})
        if BASELINE in dec and PEER in peer:
            out[f"decode {mode}: ours rmsnorm / transformers eager tokens/s"] = {
                "ours": dec[BASELINE]["tokens_per_s"] / peer[PEER]["tokens_per_s"],
                "paper": None,
            }
    mem = results.get("step_memory", {})
    if "chunked" in mem:
        for other in ("plain", PEER):
            if other in mem:
                out[f"step peak memory growth: ours chunked / {other}"] = {
                    "ours": mem["chunked"]["peak_growth_bytes"] / mem[other]["peak_growth_bytes"],
                    "target": 0.55 if other == PEER else None,
                }
    for item in out.values():
        item.setdefault("paper", None)
    return out
