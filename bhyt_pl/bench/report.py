"""Result entries (medians and their ratios to ``rmsnorm``) and the markdown tables.

Two ratio names, so the direction is never ambiguous: ``time_vs_rmsnorm`` compares times (below 1 is
faster), ``throughput_vs_rmsnorm`` tokens/s (above 1 is faster). In the default parts both are quotients
of the medians of one interleaved run; in ``prenorm`` ``time_vs_rmsnorm`` is a ``paired_ratio`` (the median
of per-repetition ratios with its interval).
"""

from __future__ import annotations

from typing import Any

from bhyt_pl.bench.timing import median

__all__ = ["PAPER", "markdown", "ratio_markdown", "throughput_entries", "time_entries"]

BASELINE = "rmsnorm"

# docs/method.md, section 7 (Llama-1B, GPU; hardware and batch not published)
PAPER = {
    "train_bhyt_vs_rmsnorm": 83.0 / 81.7,
    "generate_bhyt_vs_rmsnorm": 1.0177,
    "generate_bhyt_vs_peri_ln": 1.18,
    "train_bhyt_vs_bhyt_exact": 0.381 / 0.335,
}


def time_entries(samples: dict[str, list[float]], baseline: str = BASELINE) -> dict[str, dict[str, Any]]:
    """name -> {samples_s, median_s, time_vs_rmsnorm}; the ratio is None without the baseline."""
    base = median(samples[baseline]) if baseline in samples else None
    out = {}
    for name, s in samples.items():
        m = median(s)
        out[name] = {"samples_s": s, "median_s": m, "time_vs_rmsnorm": m / base if base else None}
    return out


def throughput_entries(
    seconds: dict[str, float], tokens: int, samples: dict[str, list[float]] | None = None, baseline: str = BASELINE
) -> dict[str, dict[str, Any]]:
    """name -> {median_s, tokens_per_s, throughput_vs_rmsnorm} from per-candidate median seconds."""
    out = {}
    for name, sec in seconds.items():
        entry: dict[str, Any] = {"median_s": sec, "tokens_per_s": tokens / sec}
        if samples is not None:
            entry["samples_s"] = samples[name]
        out[name] = entry
    for entry in out.values():
        base = out.get(baseline)
        entry["throughput_vs_rmsnorm"] = entry["tokens_per_s"] / base["tokens_per_s"] if base else None
    return out


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(results: dict[str, Any]) -> str:
    """The per-scheme table (one row per scheme) and the peer lines, as markdown."""
    s = results["settings"]
    cols: list[tuple[str, Any]] = []  # (header, getter(label) -> str)
    for key, by_mode in results.get("sites", {}).items():
        for mode, entries in by_mode.items():
            cols.append(
                (
                    f"sites {key} {mode} ms (x rms)",
                    lambda v, e=entries: (
                        f"{e[v]['median_s'] * 1e3:.1f} ({_fmt(e[v]['time_vs_rmsnorm'])})" if v in e else "-"
                    ),
                )
            )
    for mode, entries in results.get("train_step", {}).items():
        cols.append(
            (
                f"train {mode} tok/s (x rms)",
                lambda v, e=entries: (
                    f"{e[v]['tokens_per_s']:.0f} ({_fmt(e[v]['throughput_vs_rmsnorm'])})" if v in e else "-"
                ),
            )
        )
    for mode, parts in results.get("generation", {}).items():
        for part in ("prefill", "decode"):
            cols.append(
                (
                    f"{part} {mode} tok/s (x rms)",
                    lambda v, e=parts[part]: (
                        f"{e[v]['tokens_per_s']:.1f} ({_fmt(e[v]['throughput_vs_rmsnorm'])})" if v in e else "-"
                    ),
                )
            )
    memory = results.get("memory", {})
    if memory:
        mem_keys = sorted({k for m in memory.values() for k in m})
        for k in mem_keys:
            cols.append(
                (f"{k} MiB", lambda v, k=k: _fmt(memory.get(v, {}).get(k, None) and memory[v][k] / 2**20, ".1f"))
            )
    labels = list(s["schemes"])
    for section in ("train_step", "generation"):
        for entries in results.get(section, {}).values():
            entries = entries.get("decode", entries)
            labels += [n for n in entries if n not in labels]
    lines = [
        f"Settings: preset `{s['preset']}`, {s['device']} {s['dtype']}, {s['threads']} thread(s), "
        f"train batch {s['batch']} x {s['seq_len']} tokens, sites at d = {s['site_dims']} with {s['site_tokens']} "
        f"tokens, generation batch {s['gen_batch']}: {s['prompt_len']}-token prompt + {s['new_tokens']} new tokens, "
        f"{s['repeats']} interleaved repetitions, medians; ratios are to `rmsnorm` in the same run.",
        "",
        "| scheme | " + " | ".join(h for h, _ in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for v in labels:
        lines.append(f"| {v} | " + " | ".join(get(v) for _, get in cols) + " |")
    for mode, parts in results.get("generation", {}).items():
        if parts.get("compile_s"):
            times = ", ".join(f"`{n}` {t:.1f} s" for n, t in parts["compile_s"].items())
            lines += ["", f"Compile time of {mode} generation (first call minus a warm call): {times}."]
    summary = results.get("summary", {})
    if summary:
        lines += ["", "| comparison | ours | paper |", "|---|---|---|"]
        for name, item in summary.items():
            lines.append(f"| {name} | {_fmt(item.get('ours'), '.3f')} | {_fmt(item.get('paper'), '.3f')} |")
    bandwidth = results.get("bandwidth")
    if bandwidth and results.get("sites"):
        refs = [r for r, bw in bandwidth.items() if bw]
        described = ", ".join(f"{r} {bandwidth[r] / 1e9:.1f} GB/s" for r in refs)
        lines += [
            "",
            f"Norm-site roofline: compulsory bytes of one block's sites (forward + backward) over the median "
            f"time, against the memory bandwidth ({described}; copy = `dst.copy_(src)` of 256 MiB in this run).",
            "",
            "| scheme | sites | MB moved | GB/s | " + " | ".join(f"x {r} bandwidth" for r in refs) + " |",
            "|---|---|---|---|" + "---|" * len(refs),
        ]
        for key, by_mode in results["sites"].items():
            for mode, entries in by_mode.items():
                for label, e in entries.items():
                    fractions = " | ".join(_fmt(e.get(f"fraction_of_{r}_bandwidth"), ".3f") for r in refs)
                    moved, rate = e["bytes"] / 1e6, e["bytes_per_s"] / 1e9
                    lines.append(f"| {label} | {key} {mode} | {moved:.0f} | {rate:.2f} | {fractions} |")
    step_memory = results.get("step_memory")
    if step_memory:
        ref = step_memory.get("hf_transformers")
        lines += [
            "",
            f"Step peak memory: `{s['mem_preset']}` with {s['mem_overrides']}, {s['dtype']}, batch "
            f"{s['mem_batch']} x {s['mem_seq_len']} tokens; growth of the peak over one forward + backward "
            "(gradients preallocated, no optimizer step), each side in its own process.",
            "",
            "| side | loss | peak growth MiB | x transformers |",
            "|---|---|---|---|",
        ]
        for side, m in step_memory.items():
            x = m["peak_growth_bytes"] / ref["peak_growth_bytes"] if ref else None
            lines.append(f"| {side} | {m['loss_impl']} | {m['peak_growth_bytes'] / 2**20:.0f} | {_fmt(x, '.3f')} |")
    tanh = results.get("tanh")
    if tanh:
        lines += ["", "| tanh formulation (fp32, " + str(tanh["shape"]) + ") | eager ms | compiled ms | max rel err |"]
        lines.append("|---|---|---|---|")
        for name, t in tanh["formulations"].items():
            lines.append(
                f"| {name} | {_fmt(t.get('eager_ms'), '.3f')} | {_fmt(t.get('compiled_ms'), '.3f')} | "
                f"{t['max_rel_error']:.1e} |"
            )
    return "\n".join(lines) + "\n"


def _interval(r: dict[str, float]) -> str:
    return f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"


def ratio_markdown(results: dict[str, Any]) -> str:
    """Tables of the ``prenorm``, ``train_ratio`` and ``decode`` parts: medians, and per-repetition
    ratios as ``median [low, high]`` (a distribution-free interval of the median, ``paired_ratio``)."""
    out = []
    for key, e in results.get("prenorm", {}).items():
        out += [
            f"\nPre-norm sites (pre_attn then pre_mlp, fwd+bwd), {key}, {e['tokens']} tokens:",
            "",
            "| scheme | ms | time x rmsnorm [interval] | coverage |",
            "|---|---|---|---|",
        ]
        for n, ms in e["median_ms"].items():
            r = e["time_vs_rmsnorm"][n]
            out.append(f"| {n} | {ms:.1f} | {_interval(r)} | {r['coverage']:.3f} |")
    tr = results.get("train_ratio")
    if tr:
        out += ["\nTraining step, one interleaved loop:", "", "| candidate | tok/s |", "|---|---|"]
        out += [f"| {n} | {v:.0f} |" for n, v in tr["tokens_per_s"].items()]
        out += ["", "| ratio | median [interval] | coverage | n |", "|---|---|---|---|"]
        out += [f"| {n} | {_interval(r)} | {r['coverage']:.3f} | {r['n']} |" for n, r in tr["ratios"].items()]
    for size, e in results.get("decode", {}).items():
        out += [
            f"\nWhole generate call, {size}:",
            "",
            "| side | ms | x transformers [interval] | matmul | attention | other |",
            "|---|---|---|---|---|---|",
        ]
        for n, ms in e["median_ms"].items():
            r = e.get("vs_transformers", {}).get(n)
            prof = e.get("profile", {}).get(n)
            split = (
                " | ".join(f"{prof[f'{k}_fraction']:.0%}" for k in ("matmul", "attention", "other"))
                if prof
                else "- | - | -"
            )
            out.append(f"| {n} | {ms:.1f} | {_interval(r) if r else '-'} | {split} |")
        if e.get("bound_vs_transformers"):
            out.append(f"\nBound (transformers' time / ours compiled matmul time): {e['bound_vs_transformers']:.2f}x")
        if e.get("compile_s"):
            out.append(
                "Compile s (first call minus a warm one): "
                + ", ".join(f"{n} {t:.1f}" for n, t in e["compile_s"].items())
            )
    return "\n".join(out)
