"""``python -m bhyt_pl study``: the depth study and the stability sweep (docs/depth_study.md).

Depth study (default): every scheme trained with the same seed, data, budget and learning rate on a
deep, narrow model; writes ``report.md`` (final train/validation loss, perplexity, tokens/s,
last-layer magnitude and variance at initialisation and at the end, divergence), ``depth_init.png``,
``depth_final.png`` (paper Figure 3 view: every scheme on one plot), ``loss.png``, ``results.json``
and one ``runs/<label>/`` folder per run (CSV logs, ``result.json``).

Stability sweep (``--sweep``): schemes x depths x learning rates; ``report.md`` with the grid as a
table and ``sweep_grid.png``.

Examples::

    python -m bhyt_pl study --quick                       # minutes on a laptop CPU
    python -m bhyt_pl study                               # the committed report (docs/depth_study.md)
    python -m bhyt_pl study --sweep --quick               # small stability grid
    python -m bhyt_pl study --preset llama-374m --data-files none --tokenizer meta-llama/Llama-3.2-1B \\
        --seq-len 1024 --batch-size 16 --steps 5000 --lr 3e-4 --accelerator gpu --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import math
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bhyt_pl.bench.variants import Variant, parse_variant
from bhyt_pl.config import PRESETS, LlamaConfig
from bhyt_pl.study import report
from bhyt_pl.study.runner import RunResult, RunSpec, TrainerSettings, run_one
from bhyt_pl.study.sweep import depth_study_specs, sweep_specs
from bhyt_pl.validation import raise_if_problems

__all__ = ["DEFAULT_SCHEMES", "FULL", "QUICK", "SWEEP", "SWEEP_QUICK", "Budget", "main", "parser"]

log = logging.getLogger(__name__)

DEFAULT_SCHEMES = ("rmsnorm", "layernorm", "peri_ln", "lns", "dyt", "bhyt", "bhyt_exact")
"""The schemes of the BHyT paper's comparison; ``rmsnorm`` is the reference of the loss comparison. Any other
registered scheme (``derf``, ``dyisru``, ``seednorm``, ``post_ln``, ``mix_ln``, your own) runs with ``--schemes``."""


@dataclass(frozen=True)
class Budget:
    """The defaults of one mode; every field can be overridden on the command line."""

    preset: str
    layers: int | None
    steps: int
    seq_len: int
    batch_size: int
    val_batches: int
    lr: float
    depths: tuple[int, ...] = ()
    lrs: tuple[float, ...] = ()


# Sized on 2 shared CPU cores (docs/depth_study.md has the measured times).
FULL = Budget("deep-32x128", None, 200, 64, 8, 8, 3e-3)
QUICK = Budget("deep-32x128", 8, 60, 64, 8, 4, 3e-3)
# lr 1e-2 trains and 1e-1 diverges for most schemes within 40 steps (docs/depth_study.md): the grids straddle it
SWEEP = Budget("deep-32x128", None, 100, 64, 8, 2, 3e-3, depths=(8, 16, 32, 64), lrs=(1e-2, 3e-2, 1e-1))
SWEEP_QUICK = Budget("deep-32x128", None, 40, 64, 4, 1, 3e-3, depths=(4, 16), lrs=(1e-2, 1e-1, 1.0))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bhyt_pl study",
        description="Train every norm scheme with the same seed, data and budget and report depth-wise activation "
        "magnitude/variance, losses, throughput and divergence (--sweep: stability grid over depth x learning rate).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    mode = p.add_argument_group("mode")
    mode.add_argument("--quick", action="store_true", help="small budget (minutes on 2 CPU cores)")
    mode.add_argument("--sweep", action="store_true", help="stability sweep: schemes x --depths x --lrs")
    model = p.add_argument_group("model and budget (unset: the mode's default, see docs/depth_study.md)")
    model.add_argument("--preset", choices=sorted(PRESETS), default=None, help=f"model preset; default {FULL.preset}")
    model.add_argument("--layers", type=int, default=None, help="override the preset's n_layers (not with --sweep)")
    model.add_argument(
        "--override", nargs="*", default=[], metavar="FIELD=VALUE", help="other LlamaConfig fields, e.g. dim=256"
    )
    model.add_argument(
        "--schemes",
        nargs="+",
        default=list(DEFAULT_SCHEMES),
        help="schemes, each name[:key=value,...] (e.g. bhyt:lambda_attn=0.1,lambda_mlp=0.1)",
    )
    model.add_argument("--steps", type=int, default=None, help=f"optimizer steps per run; default {FULL.steps}")
    model.add_argument("--lr", type=float, default=None, help=f"peak learning rate (depth study); default {FULL.lr}")
    model.add_argument("--depths", type=int, nargs="+", default=None, help=f"sweep depths; default {SWEEP.depths}")
    model.add_argument("--lrs", type=float, nargs="+", default=None, help=f"sweep learning rates; default {SWEEP.lrs}")
    model.add_argument("--seed", type=int, default=42, help="seed of the model init (same for every run)")
    model.add_argument("--warmup-ratio", type=float, default=0.05, help="linear warmup fraction of the steps")
    model.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices only)")
    model.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip")
    model.add_argument(
        "--max-loss",
        type=float,
        default=None,
        help="divergence bound on the training loss (NaN/inf always diverges); default 1.5 * ln(vocab_size)",
    )
    data = p.add_argument_group("data (C4DataModule)")
    data.add_argument(
        "--data-files",
        default="embedded",
        help="C4-format shards: 'embedded' (bundled corpus), a directory or glob; 'none' streams --data-path",
    )
    data.add_argument("--data-path", default="allenai/c4", help="Hub dataset when --data-files none")
    data.add_argument("--tokenizer", default="embedded", help="'embedded', a tokenizer.json path or a Hub name")
    data.add_argument("--seq-len", type=int, default=None, help=f"training sequence length; default {FULL.seq_len}")
    data.add_argument("--batch-size", type=int, default=None, help=f"sequences per step; default {FULL.batch_size}")
    data.add_argument("--val-batches", type=int, default=None, help="fixed validation batches (the first: depth stats)")
    data.add_argument("--data-seed", type=int, default=42, help="shuffle seed of the training stream")
    data.add_argument("--shuffle-buffer", type=int, default=1000, help="documents in the streaming shuffle buffer")
    data.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    hw = p.add_argument_group("hardware (L.Trainer)")
    hw.add_argument("--accelerator", default="cpu", help="cpu, gpu, auto, ...")
    hw.add_argument("--devices", default="1", help="devices per run; more than 1: launch with torchrun")
    hw.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, ...")
    hw.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    hw.add_argument("--progress-bar", action="store_true", help="show Lightning's progress bar")
    p.add_argument("--out", type=Path, default=None, help="report folder; default runs/study[-sweep][-quick]")
    return p


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    overrides = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--override {item!r} must be FIELD=VALUE, e.g. --override dim=256")
        overrides[key] = _literal(value)
    return overrides


def resolve(args: argparse.Namespace) -> tuple[Budget, dict[str, Any]]:
    """The budget (mode defaults, then explicit options) and the model overrides; fails early on bad values."""
    base = (SWEEP_QUICK if args.quick else SWEEP) if args.sweep else (QUICK if args.quick else FULL)
    budget = Budget(
        preset=args.preset or base.preset,
        layers=args.layers if args.layers is not None else base.layers,
        steps=args.steps if args.steps is not None else base.steps,
        seq_len=args.seq_len if args.seq_len is not None else base.seq_len,
        batch_size=args.batch_size if args.batch_size is not None else base.batch_size,
        val_batches=args.val_batches if args.val_batches is not None else base.val_batches,
        lr=args.lr if args.lr is not None else base.lr,
        depths=tuple(args.depths) if args.depths else base.depths,
        lrs=tuple(args.lrs) if args.lrs else base.lrs,
    )
    problems = []
    for name in ("steps", "seq_len", "batch_size", "val_batches"):
        if getattr(budget, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(budget, name)}")
    if budget.layers is not None and budget.layers < 1:
        problems.append(f"--layers must be >= 1, got {budget.layers}")
    if args.sweep and budget.layers is not None and args.layers is not None:
        problems.append("--layers does not apply to --sweep; give the depths with --depths")
    if args.sweep and (any(d < 1 for d in budget.depths) or any(not lr > 0 for lr in budget.lrs)):
        problems.append(f"--depths must be >= 1 and --lrs > 0, got {budget.depths} and {budget.lrs}")
    if not args.sweep and not budget.lr > 0:
        problems.append(f"--lr must be > 0, got {budget.lr}")
    if args.max_loss is not None and not args.max_loss > 0:
        problems.append(f"--max-loss must be > 0, got {args.max_loss}")
    overrides: dict[str, Any] = {}
    try:
        overrides = _parse_overrides(args.override)
    except ValueError as exc:
        problems.append(str(exc))
    if budget.layers is not None and not args.sweep:
        overrides["n_layers"] = budget.layers
    raise_if_problems("study arguments", problems)
    config = LlamaConfig.from_name(budget.preset, **overrides)  # unknown fields and bad values fail here
    if budget.seq_len > config.max_seq_len:
        raise ValueError(
            f"--seq-len {budget.seq_len} exceeds the preset's max_seq_len={config.max_seq_len}; "
            f"raise it with --override max_seq_len={budget.seq_len}"
        )
    return budget, overrides


def _datamodule(args: argparse.Namespace, budget: Budget):  # -> C4DataModule
    from bhyt_pl.data import C4DataModule

    data_files = None if str(args.data_files).lower() == "none" else args.data_files
    return C4DataModule(
        path=args.data_path,
        data_files=data_files,
        tokenizer=args.tokenizer,
        seq_len=budget.seq_len,
        batch_size=budget.batch_size,
        num_workers=args.num_workers,
        shuffle_buffer=args.shuffle_buffer,
        seed=args.data_seed,
    )


def fixed_batches(datamodule: Any, count: int) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` validation batches (training batches when the source has no validation split):
    the same tensors for every run; the first one is where depth statistics are measured."""
    datamodule.setup("validate")
    loader = datamodule.val_dataloader()
    if isinstance(loader, list):  # C4DataModule returns [] without a validation split
        log.warning("the data source has no validation split: validating on the first training batches")
        loader = datamodule.train_dataloader()
    batches = []
    for batch in loader:
        batches.append({"input_ids": batch["input_ids"].clone(), "labels": batch["labels"].clone()})
        if len(batches) == count:
            break
    if not batches:
        raise ValueError("the data source yielded no batch for validation and depth statistics")
    return batches


def write_report(
    out: Path, results: list[RunResult], meta: dict[str, Any], sweep: bool, max_loss: float, figures: bool = True
) -> dict[str, Path]:
    """``results.json``, ``report.md`` and (``figures``) the PNGs under ``out``; returns the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "report": out / "report.md"}
    paths["results"].write_text(json.dumps({"meta": meta, "runs": [r.to_dict() for r in results]}, indent=1))
    title = f"{meta['preset']} ({meta['n_layers_label']} layers), {meta['steps']} steps, seq {meta['seq_len']}"
    lines = [f"# {'Stability sweep' if sweep else 'Depth study'}", "", f"Command: `{meta['command']}`", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("command", "machine", "n_layers_label")]
    lines.append(f"- layers: {meta['n_layers_label']}")
    lines.append("- machine: " + ", ".join(f"{k} {v}" for k, v in meta["machine"].items()))
    lines.append("")
    if sweep:
        if figures:
            paths["grid"] = report.save_figure(report.sweep_figure(results, max_loss), out / "sweep_grid.png")
        lines += [
            f"Final training loss (mean of the last 10% of steps); **diverged**: loss NaN/inf or > {max_loss:.3g} "
            "at that step.",
            "",
            report.sweep_table(results),
            "",
            "![stability grid](sweep_grid.png)",
        ]
    else:
        if figures:
            paths["depth_init"] = report.save_figure(
                report.depth_figure(results, "init", f"at initialisation: {title}"), out / "depth_init.png"
            )
            paths["depth_final"] = report.save_figure(
                report.depth_figure(results, "final", f"after training: {title}"), out / "depth_final.png"
            )
            paths["loss"] = report.save_figure(report.loss_figure(results, title), out / "loss.png")
        facts = report.orderings(results)
        lines += [
            "train loss: mean of the last 10% of steps; val loss/ppl: token-weighted over the fixed validation "
            f"batches; tokens/s: training tokens / wall time of the training loop; diverged: loss NaN/inf or > "
            f"{max_loss:.3g}. Magnitude and variance: last block's output on the fixed batch, eval mode.",
            "",
            report.results_table(results),
            "",
            "## Theorem condition lambda/kappa < 1/sqrt(L) (BHyT runs)",
            "",
            report.bound_table(results),
            "",
            "## Orderings at the end (largest first; diverged runs left out)",
            "",
        ]
        for stat in ("magnitude", "variance"):
            order = " > ".join(f"{name} ({report._num(v)})" for name, v in facts[f"{stat}_order"])
            lines.append(f"- last-layer {stat}: {order}")
        for key in ("val_loss_minus_reference", "train_loss_minus_reference"):
            if key in facts:
                diffs = ", ".join(f"{k} {v:+.3f}" for k, v in facts[key].items())
                lines.append(f"- {key.replace('_', ' ')} (rmsnorm): {diffs}")
        lines += ["", "![at initialisation](depth_init.png)", "", "![after training](depth_final.png)", ""]
        lines += ["![training loss](loss.png)"]
    paths["report"].write_text("\n".join(lines) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    """Run the study; 0 when every run finished or diverged (a result), 1 when a run failed with an error."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        budget, overrides = resolve(args)
        variants: list[Variant] = [parse_variant(s) for s in args.schemes]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        print(f"error: --schemes has duplicates: {labels}", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    mode = "study" + ("-sweep" if args.sweep else "") + ("-quick" if args.quick else "")
    out: Path = args.out if args.out is not None else Path("runs") / mode
    vocab = LlamaConfig.from_name(budget.preset, **overrides).vocab_size
    max_loss = args.max_loss if args.max_loss is not None else 1.5 * math.log(vocab)
    base = RunSpec(
        label="base",
        norm="rmsnorm",
        preset=budget.preset,
        overrides=overrides,
        lr=budget.lr,
        steps=budget.steps,
        seed=args.seed,
        max_loss=max_loss,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
    )
    if args.sweep:
        specs = sweep_specs(variants, budget.depths, budget.lrs, base)
        n_layers_label = "/".join(map(str, budget.depths))
    else:
        specs = depth_study_specs(variants, base)
        n_layers_label = str(LlamaConfig.from_name(budget.preset, **overrides).n_layers)
    devices: int | str = int(args.devices) if str(args.devices).isdigit() else args.devices
    settings = TrainerSettings(args.accelerator, devices, args.precision, progress_bar=args.progress_bar)
    factory = partial(_datamodule, args, budget)
    from bhyt_pl.bench.timing import machine_info

    meta: dict[str, Any] = {
        "command": "python -m bhyt_pl study " + shlex.join(argv),
        "mode": mode,
        "preset": budget.preset,
        "n_layers_label": n_layers_label,
        "overrides": overrides,
        "steps": budget.steps,
        "seq_len": budget.seq_len,
        "batch_size": budget.batch_size,
        "tokens_per_step": budget.seq_len * budget.batch_size,
        "lr": list(budget.lrs) if args.sweep else budget.lr,
        "seed": args.seed,
        "data": f"{args.data_files} (tokenizer {args.tokenizer})",
        "validation": f"{budget.val_batches} fixed batches; depth statistics on the first",
        "max_loss": round(max_loss, 4),
        "machine": machine_info(torch.device("cuda" if args.accelerator in ("gpu", "cuda") else "cpu")),
    }
    started = time.perf_counter()
    batches = fixed_batches(factory(), budget.val_batches)
    results: list[RunResult] = []
    try:
        for i, spec in enumerate(specs, 1):
            log.info("study run %d/%d: %s", i, len(specs), spec.label)
            t0 = time.perf_counter()
            result = run_one(spec, factory, batches, settings, out)
            results.append(result)
            log.info(
                "  %s: %s, train loss %.4f, val loss %.4f, %.0f tokens/s, %.0f s",
                spec.label,
                result.status,
                result.train_loss,
                result.val_loss,
                result.tokens_per_sec,
                time.perf_counter() - t0,
            )
            meta["wall_seconds"] = round(time.perf_counter() - started, 1)
            if rank_zero_only.rank == 0:  # tables after every run: an interrupted study keeps what it measured
                write_report(out, results, meta, args.sweep, max_loss, figures=False)
    finally:  # figures once, at the end or on an interrupt, for the runs that finished
        meta["wall_seconds"] = round(time.perf_counter() - started, 1)
        meta["runs_finished"] = f"{len(results)}/{len(specs)}"
        if rank_zero_only.rank == 0 and results:
            paths = write_report(out, results, meta, args.sweep, max_loss)
            log.info("study finished in %.0f s; report: %s", meta["wall_seconds"], paths["report"])
    return 1 if any(r.status == "error" for r in results) else 0
