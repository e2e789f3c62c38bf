"""One study run: one Lightning fit of ``LlamaLM`` with a fixed seed, data and budget, with divergence
detection, depth statistics along training, StabilityMonitor's columns, layer importance at the end,
and a record that survives divergence.

Every run in a study trains through the same code path users train with (``LlamaLM`` + ``Trainer``);
runs follow one another in one process. What a run measures:

- ``train_loss``: the mean training loss over the last ``tail`` optimizer steps (a single step is noisy);
- ``val_loss`` / ``val_perplexity``: ``trainer.validate`` on a fixed list of validation batches, the same
  for every run (token-weighted mean, ``LlamaLM.validation_step``);
- ``tokens_per_sec``: training tokens / wall time of the training loop (model build, depth statistics
  and validation excluded; the first step, with its allocator warm-up, included);
- depth statistics (docs/method.md, section 6, paper Figure 3): ``DepthStatsCollector`` on every fixed
  validation batch, in eval mode, before the first step and after the last (magnitude = mean over tokens of
  ``||y_t||_2``, variance = mean over tokens of ``Var_d(y_t)``, ``y`` a block output), with the validation
  loss of the same forward passes (``val_loss``);
- robust depth statistics (same pass): ``median_magnitude`` (median over the tokens of all batches of ``||y_t||_2``,
  position 0 left out: the first token often carries a massive activation), ``magnitude_top2_removed``
  (mean ``||y_t||_2`` after dropping the two channels with the largest mean ``|y|`` over the batch: the
  one or two massive channels the first blocks write dominate the plain magnitude);
- trajectories: the depth statistics and the validation loss at step 0, every ``trajectory_every`` optimizer
  steps (``TrajectoryRecorder``) and at the end;
- stability: ``StabilityMonitor`` on the training batch (``stability_every`` steps): the spike counts,
  the layer with the largest gradient norm and the last layer's attention entropy at each logging step;
- layer importance: the loss on the first validation batch with block ``i``
  replaced by the identity, minus the full model's, for every ``i`` (one block at a time;
  ``layer_importance``);
- divergence: ``DivergenceMonitor`` stops the fit at the first optimizer step whose loss is NaN/inf or
  above ``max_loss``; the step and loss are recorded and the logs written so far are kept.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger, Logger
from torch import nn
from typing_extensions import override

from bhyt_pl.callbacks import DepthStatsCollector
from bhyt_pl.callbacks.layer_metrics import layer_key, layer_series, layer_width, split_layer_key
from bhyt_pl.callbacks.stability import StabilityMonitor
from bhyt_pl.module import LlamaLM
from bhyt_pl.run_config import data_run_facts

__all__ = [
    "COMPILE_LOSS_TOLERANCE",
    "TRAJECTORY_STATS",
    "DivergenceMonitor",
    "MemoryLogger",
    "RunResult",
    "RunSpec",
    "TrainerSettings",
    "TrajectoryRecorder",
    "depth_statistics",
    "layer_importance",
    "log_slope",
    "run_dirname",
    "run_one",
]

COMPILE_LOSS_TOLERANCE = 2e-3
"""Largest absolute difference between a compiled and an eager run's training loss at any step, and their
validation loss, over a short run (same seed, data and spec; 8 steps in tests/study/test_runner.py). Inductor's
fused float32 kernels round differently, and training amplifies that step by step: over the default study's
180 steps the two paths end like two nearby trajectories, not like two seeds (docs/performance.md, "Study
run": validation losses 0.009 apart where seeds spread 0.04)."""

TRAJECTORY_STATS = ("magnitude", "variance", "median_magnitude", "magnitude_top2_removed", "saturation")
"""Per-layer statistics kept at every trajectory point (``saturation``: mean over the tanh sites); each point
also has its ``step`` and ``val_loss``."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """What one run trains: plain data, written into the run's ``result.json``.

    Args:
        label: unique name of the run (also its log directory), e.g. ``bhyt@lr0.003-s1`` (``plan.run_label``) or
            ``bhyt@L16-lr0.003-s0`` (the sweep).
        norm: registered norm scheme.
        norm_args: the scheme's constructor arguments.
        preset: model preset (``bhyt_pl.PRESETS``).
        overrides: ``LlamaConfig`` fields replacing the preset's (e.g. ``{"n_layers": 8}``).
        lr: peak learning rate (cosine to ``lr * min_lr_ratio``, linear warmup).
        steps: optimizer steps.
        seed: ``seed_everything`` before the model is built (the initialisation).
        data_seed: shuffle seed of the training stream (the data order).
        group: the scheme entry of the study this run belongs to (``--schemes`` text, grid values joined
            with ``|``); runs of one group differ in seed, learning rate or a grid value.
        candidate: the grid point of the group this run trains (its scheme label, e.g. ``dyt:alpha_attn=0.5``).
        seed_index: the study's seed index (0: the selection seed; ``seed = base seed + seed_index``).
        max_loss: divergence bound on the training loss (NaN/inf always diverges).
        warmup_ratio, min_lr_ratio, weight_decay, grad_clip: optimisation settings as in ``recipes/tiny.yaml``;
            ``warmup_ratio`` and ``weight_decay`` None take the scheme's recipe (``NormScheme.training_defaults``,
            nGPT: no warmup, no decay) or ``LlamaLM``'s defaults, as ``LlamaLM`` resolves and logs them.
        trajectory_every: depth statistics every this many steps (and at step 0); 0: init and end only.
        stability_every: StabilityMonitor's per-layer statistics every this many steps (0: off).
        spike_window: StabilityMonitor's spike window (spikes count after ``spike_window // 2`` steps).
        importance: measure layer importance after the fit.
    """

    label: str
    norm: str
    norm_args: dict[str, Any] = field(default_factory=dict)
    preset: str = "deep-32x128"
    overrides: dict[str, Any] = field(default_factory=dict)
    lr: float = 3e-3
    steps: int = 200
    seed: int = 42
    data_seed: int = 42
    group: str = ""
    candidate: str = ""
    seed_index: int = 0
    max_loss: float = 12.0
    warmup_ratio: float | None = None
    min_lr_ratio: float = 0.1
    weight_decay: float | None = None
    grad_clip: float = 1.0
    trajectory_every: int = 0
    stability_every: int = 0
    spike_window: int = 32
    importance: bool = False


@dataclass(frozen=True)
class TrainerSettings:
    """How every run executes (``L.Trainer`` arguments and the compile switch): the same results either way.

    Args:
        compile: ``torch.compile`` each block (``LlamaLM(compile=True)``). Per-step losses stay within
            ``COMPILE_LOSS_TOLERANCE`` of the eager run (docs/performance.md, "Study run").
    """

    accelerator: str = "cpu"
    devices: int | str = 1
    precision: str = "32-true"
    log_every_n_steps: int = 10
    progress_bar: bool = False
    compile: bool = False


@dataclass
class RunResult:
    """What one run produced. ``status`` is ``ok``, ``diverged`` or ``error``; NaN where not measured."""

    spec: RunSpec
    status: str = "ok"
    n_layers: int = 0
    dim: int = 0
    steps_done: int = 0
    diverged_step: int | None = None
    diverged_loss: float | None = None
    error: str | None = None
    train_loss: float = math.nan
    val_loss: float = math.nan
    val_perplexity: float = math.nan
    tokens: int = 0
    train_seconds: float = math.nan
    tokens_per_sec: float = math.nan
    losses: list[tuple[int, float]] = field(default_factory=list)
    depth_init: dict[str, float] = field(default_factory=dict)
    depth_final: dict[str, float] = field(default_factory=dict)
    variance_bound: dict[str, Any] | None = None
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    stability: dict[str, Any] = field(default_factory=dict)
    importance: list[float] = field(default_factory=list)
    importance_base_loss: float = math.nan
    wall_seconds: float = math.nan
    log_dir: str | None = None

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        data = dict(data)
        data["spec"] = RunSpec(**data["spec"])
        data["losses"] = [tuple(x) for x in data.get("losses", [])]
        return cls(**data)

    def last_layer(self, stat: str, which: str = "final") -> float:
        """``stat`` (``magnitude``, ``variance``, ...) of the last block, at ``init`` or ``final``."""
        values = layer_series(self.depth_init if which == "init" else self.depth_final, stat)
        return values[-1] if values else math.nan


def run_dirname(label: str) -> str:
    """A file-system-safe directory name for a run label (``bhyt:lambda_attn=0.5`` -> ``bhyt_lambda_attn=0.5``)."""
    return re.sub(r"[^A-Za-z0-9_.=@+-]+", "_", label)


class DivergenceMonitor(L.Callback):
    """Records the training loss of every optimizer step and stops the fit when it diverges.

    A step diverges when its loss is NaN, infinite or above ``max_loss``. The fit then stops through
    ``trainer.should_stop`` (a normal end: loggers flush and close, nothing raises), so the run keeps
    its partial logs and the study goes on with the next run.

    Args:
        max_loss: the bound (the initial loss of a ``V``-token vocabulary is about ``ln V``).

    Example:
        >>> monitor = DivergenceMonitor(max_loss=12.0)
        >>> trainer = L.Trainer(callbacks=[monitor], max_steps=1, logger=False)
    """

    def __init__(self, max_loss: float) -> None:
        if not max_loss > 0:
            raise ValueError(f"max_loss must be > 0, got {max_loss}")
        self.max_loss = max_loss
        self.losses: list[tuple[int, float]] = []
        self.diverged_step: int | None = None
        self.diverged_loss: float | None = None
        self.tokens = 0
        self.train_seconds = 0.0
        self._started: float | None = None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._started is not None:
            self.train_seconds = time.perf_counter() - self._started

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.tokens += int(batch["input_ids"].numel()) * trainer.world_size
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        value = float(trainer.strategy.reduce(loss.detach(), reduce_op="mean"))  # same decision on every rank
        step = trainer.global_step
        self.losses.append((step, value))
        if not math.isfinite(value) or value > self.max_loss:
            self.diverged_step, self.diverged_loss = step, value
            trainer.should_stop = True


def _robust_hooks(model: nn.Module, norms: dict[str, list[torch.Tensor]], top2: dict[str, list[float]], width: int):
    """Forward hooks on every block that collect, per batch, its output's token norms (position 0 left out) and
    the token norms without the batch's two largest mean-``|y|`` channels (summed, with the token count)."""

    def make(layer: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            y = output.detach().float()  # [B, T, d]
            if y.shape[1] > 1:  # position 0 left out
                norms.setdefault(layer, []).append(y[:, 1:].norm(dim=-1).flatten())
            if y.shape[-1] > 2:
                channel_mean = y.abs().flatten(0, -2).mean(dim=0)  # [d]
                keep = torch.ones_like(channel_mean, dtype=torch.bool)
                keep[channel_mean.topk(2).indices] = False
                kept = y[..., keep].norm(dim=-1)  # [B, T]
                total = top2.setdefault(layer, [0.0, 0.0])
                total[0] += float(kept.sum())
                total[1] += kept.numel()

        return hook

    return [block.register_forward_hook(make(layer_key(i, width))) for i, block in enumerate(model.layers)]


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # hooks inside compiled blocks would break and recompile their graphs
def depth_statistics(
    module: LlamaLM, batches: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]
) -> dict[str, float]:
    """``DepthStatsCollector`` statistics of ``module``'s Llama over ``batches`` (token-weighted means over all of
    them), in eval mode, plus the robust magnitudes ``median_magnitude`` (median over every token of every
    batch) and ``magnitude_top2_removed`` (module docstring), and ``val_loss``: the token-weighted next-token
    cross-entropy of the same forward passes (as ``LlamaLM.validation_step``). Compiled blocks run
    eagerly here: the hooks see exactly what an eager run's do.

    Returns:
        ``{"magnitude/layer_00": value, "variance/layer_00": ..., ..., "val_loss": value}``.
    """
    batches = [batches] if isinstance(batches, dict) else list(batches)
    model = module.model
    was_training = model.training
    model.eval()
    norms: dict[str, list[torch.Tensor]] = {}
    top2: dict[str, list[float]] = {}
    total, count = 0.0, 0
    try:
        device = next(model.parameters()).device
        collector = DepthStatsCollector(model)
        handles = _robust_hooks(model, norms, top2, collector.width)
        try:
            with collector:
                for batch in batches:
                    logits = model(batch["input_ids"].to(device))
                    if "labels" in batch:
                        labels = batch["labels"].to(device)
                        total += float(
                            F.cross_entropy(
                                logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"
                            )
                        )
                        count += int((labels != -100).sum())
        finally:
            for handle in handles:
                handle.remove()
        out = collector.compute()
        for i in range(len(model.layers)):
            layer = layer_key(i, collector.width)
            values = norms.get(layer)
            out[f"median_magnitude/{layer}"] = float(torch.cat(values).median()) if values else math.nan
            if layer in top2:
                out[f"magnitude_top2_removed/{layer}"] = top2[layer][0] / max(top2[layer][1], 1)
        out["val_loss"] = total / count if count else math.nan
        return out
    finally:
        model.train(was_training)


def log_slope(values: list[float], first_layer: int = 2) -> float:
    """Least-squares slope of ``ln(value)`` against the 1-based layer index, from ``first_layer`` to the last
    (the growth rate of the magnitude with depth once the first blocks have written their outliers)."""
    points = [(i + 1, math.log(v)) for i, v in enumerate(values) if i + 1 >= first_layer and v > 0 and math.isfinite(v)]
    if len(points) < 2:
        return math.nan
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def trajectory_point(step: int, stats: dict[str, float]) -> dict[str, Any]:
    """The compact record of one trajectory point: ``TRAJECTORY_STATS`` per layer and the log-magnitude slope."""
    point: dict[str, Any] = {"step": step}
    for stat in TRAJECTORY_STATS:
        if stat == "saturation":  # mean over the tanh sites present in each layer
            layers: dict[int, list[float]] = {}
            for key, value in stats.items():
                if key.startswith("saturation/"):
                    layers.setdefault(int(key.rsplit("_", 1)[1]), []).append(value)
            point[stat] = [sum(v) / len(v) for _, v in sorted(layers.items())]
        else:
            point[stat] = layer_series(stats, stat)
    point["magnitude_slope"] = log_slope(point["magnitude"])
    point["median_magnitude_slope"] = log_slope(point["median_magnitude"])
    point["val_loss"] = stats.get("val_loss", math.nan)
    return point


class TrajectoryRecorder(L.Callback):
    """Depth statistics and validation loss on fixed batches (eval mode, no gradients) every ``every_n_steps``
    optimizer steps.

    Args:
        batches: the fixed batches the statistics are measured on (the same in every run of a study).
        every_n_steps: the cadence; the points are ``trajectory_point`` records in ``points``.
    """

    def __init__(self, batches: list[dict[str, torch.Tensor]], every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.batches, self.every_n_steps = batches, every_n_steps
        self.points: list[dict[str, Any]] = []

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0 and step < trainer.max_steps and not trainer.should_stop:
            self.points.append(trajectory_point(step, depth_statistics(pl_module, self.batches)))


class MemoryLogger(Logger):
    """Keeps every logged metric in memory (``metrics[name] = [(step, value), ...]``): the study reads
    StabilityMonitor's columns from here instead of parsing CSV files."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, list[tuple[int, float]]] = {}

    @property
    @override
    def name(self) -> str:
        return "memory"

    @property
    @override
    def version(self) -> str:
        return "0"

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append((int(step or 0), float(value)))


def stability_summary(metrics: dict[str, list[tuple[int, float]]], n_layers: int) -> dict[str, Any]:
    """StabilityMonitor's columns from its logged metrics: final spike counts and, per logging step, the
    layer (1-based) with the largest gradient norm and the last layer's attention entropy."""
    prefix = "stability/"
    block_grads = {  # grad_norm/layer_<ii>: the whole block's, not a site's
        split[1]: dict(v)
        for k, v in metrics.items()
        if (split := split_layer_key(k)) is not None and split[0] == prefix + "grad_norm"
    }
    steps = sorted({s for v in block_grads.values() for s in v})
    last = layer_key(n_layers - 1, layer_width(n_layers))
    by_step: list[dict[str, Any]] = []
    for step in steps:
        grads = {i: v.get(step) for i, v in block_grads.items()}
        grads = {i: g for i, g in grads.items() if g is not None and math.isfinite(g)}
        entropy = dict(metrics.get(f"{prefix}attn_entropy/{last}", [])).get(step, math.nan)
        by_step.append(
            {
                "step": step,
                "max_grad_layer": (max(grads, key=grads.get) + 1) if grads else None,
                "max_grad_norm": max(grads.values()) if grads else math.nan,
                "last_attn_entropy": entropy,
            }
        )

    def final(key: str) -> float:
        values = metrics.get(prefix + key, [])
        return values[-1][1] if values else 0.0

    return {
        "loss_spikes": int(final("loss_spikes")),
        "grad_norm_spikes": int(final("grad_norm_spikes")),
        "steps": by_step,
    }


class _SkipBlock(nn.Module):
    """A block replaced by the identity: returns its input (the residual stream passes unchanged)."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x


class _CachedBlock(nn.Module):
    """A block whose output on this batch is already known: returns it without recomputing."""

    def __init__(self, output: torch.Tensor) -> None:
        super().__init__()
        self.output = output

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.output


@torch.no_grad()
def _loss_sum(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Summed next-token cross-entropy (as ``LlamaLM.compute_loss``) over ``batch`` and the token count."""
    device = next(model.parameters()).device
    labels = batch["labels"].to(device)
    logits = model(batch["input_ids"].to(device))
    total = float(F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"))
    return total, int((labels != -100).sum())


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # blocks swapped in and out: no graphs to trace for one forward each
def layer_importance(module: LlamaLM, batches: list[dict[str, torch.Tensor]]) -> tuple[float, list[float]]:
    """The full model's validation loss and, for every block ``i``, the loss with block ``i`` replaced by the
    identity minus that loss (one block at a time, eval mode). Small values: the block does little.

    Blocks before ``i`` see exactly the inputs of the full forward, so their outputs are taken from it
    rather than recomputed: half the block evaluations of ``L`` full forwards, with the same numbers.
    """
    model = module.model
    was_training = model.training
    model.eval()
    blocks = list(model.layers)
    n = len(blocks)
    base_total, count, totals = 0.0, 0, [0.0] * n
    try:
        for batch in batches:
            outputs: list[torch.Tensor] = []
            handles = [b.register_forward_hook(lambda m, a, out: outputs.append(out)) for b in blocks]
            try:
                loss, tokens = _loss_sum(model, batch)
            finally:
                for handle in handles:
                    handle.remove()
            base_total, count = base_total + loss, count + tokens
            for i in range(n):
                for j in range(i):
                    model.layers[j] = _CachedBlock(outputs[j])
                model.layers[i] = _SkipBlock()
                try:
                    totals[i] += _loss_sum(model, batch)[0]
                finally:
                    for j in range(i + 1):
                        model.layers[j] = blocks[j]
        base = base_total / max(count, 1)
        return base, [t / max(count, 1) - base for t in totals]
    finally:
        model.train(was_training)


def _variance_bound(module: LlamaLM) -> dict[str, Any] | None:
    """The scheme's ``variance_bound`` diagnostic (BHyT: ``lambda/kappa < 1/sqrt(L)`` at the initial and the
    learned lambdas), None for schemes without one."""
    scheme = module.config.norm_scheme()
    blocks = [layer.norms for layer in module.model.layers]
    return scheme.diagnostics(module.config.n_layers, blocks).get("variance_bound")


def run_one(
    spec: RunSpec,
    datamodule_factory: Any,
    val_batches: list[dict[str, torch.Tensor]],
    settings: TrainerSettings,
    out_dir: Path,
) -> RunResult:
    """Train one run and measure it. Never raises for a failure of the run itself (recorded as ``error``).

    Args:
        spec: the run.
        datamodule_factory: ``(data_seed) -> LightningDataModule``: a fresh data module with the study's
            data, sequence length and batch size, shuffled with ``data_seed`` (runs with the same data seed
            see the same batches in the same order).
        val_batches: fixed validation batches: validation loss and depth statistics at every trajectory point.
        settings: accelerator, devices, precision.
        out_dir: the study folder; logs go to ``out_dir/runs/<label>/``.
    """
    result = RunResult(spec=spec)
    run_dir = out_dir / "runs" / run_dirname(spec.label)
    run_dir.mkdir(parents=True, exist_ok=True)
    monitor = DivergenceMonitor(spec.max_loss)
    recorder = TrajectoryRecorder(val_batches, spec.trajectory_every) if spec.trajectory_every > 0 else None
    memory = MemoryLogger()
    started = time.perf_counter()
    try:
        if settings.compile:
            # each run traces its own graphs (compiled kernels come from the Inductor cache on disk): a run does not
            # depend on what ran before it, and a worker's many schemes never reach dynamo's recompile limit
            torch.compiler.reset()
        L.seed_everything(spec.seed, verbose=False)
        datamodule = datamodule_factory(spec.data_seed)
        module = LlamaLM(
            preset=spec.preset,
            overrides=dict(spec.overrides),
            norm=spec.norm,
            norm_args=dict(spec.norm_args),
            run_facts=data_run_facts(datamodule),
            tokenizer=datamodule.tokenizer,
            lr=spec.lr,
            min_lr_ratio=spec.min_lr_ratio,
            warmup_ratio=spec.warmup_ratio,
            weight_decay=spec.weight_decay,
            compile=settings.compile,
        )
        module.configure_model()  # built now (fit keeps it): the initial statistics see the weights that train
        result.n_layers, result.dim = module.config.n_layers, module.config.dim
        result.depth_init = depth_statistics(module, val_batches)
        points = recorder.points if recorder is not None else []
        points.append(trajectory_point(0, result.depth_init))
        callbacks: list[L.Callback] = [monitor] + ([recorder] if recorder is not None else [])
        if spec.stability_every > 0:
            stability = StabilityMonitor(
                every_n_steps=spec.stability_every,
                figures=False,
                spike_window=spec.spike_window,
                spike_min_history=max(2, spec.spike_window // 2),
            )
            callbacks.append(stability)  # its logging steps run eagerly when the blocks are compiled
        logger = CSVLogger(out_dir / "runs", name=run_dirname(spec.label), version="logs")  # runs/<label>/logs/
        result.log_dir = str(Path(logger.log_dir).relative_to(out_dir))
        trainer = L.Trainer(
            accelerator=settings.accelerator,
            devices=settings.devices,
            precision=settings.precision,
            max_steps=spec.steps,
            gradient_clip_val=spec.grad_clip,
            limit_val_batches=0,  # validation once, after the fit, on the fixed batches
            num_sanity_val_steps=0,
            log_every_n_steps=min(settings.log_every_n_steps, spec.steps),
            logger=[logger, memory],
            callbacks=callbacks,
            enable_checkpointing=False,
            enable_progress_bar=settings.progress_bar,
            enable_model_summary=False,
        )
        trainer.fit(module, datamodule=datamodule)
        result.steps_done = trainer.global_step
        result.depth_final = depth_statistics(module, val_batches)
        if monitor.diverged_step is None:  # a diverged run's end point is not a trained model's
            points.append(trajectory_point(result.steps_done, result.depth_final))
        result.trajectory = points
        result.variance_bound = _variance_bound(module)
        if spec.stability_every > 0:
            result.stability = stability_summary(memory.metrics, result.n_layers)
        if monitor.diverged_step is None:
            validator = L.Trainer(
                accelerator=settings.accelerator,
                devices=settings.devices,
                precision=settings.precision,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
            )
            loader = torch.utils.data.DataLoader(val_batches, batch_size=None)
            with torch.compiler.set_stance("force_eager"):  # a few forwards: not worth an inference graph
                metrics = validator.validate(module, dataloaders=loader, verbose=False)[0]
            result.val_loss = float(metrics["val/loss"])
            result.val_perplexity = float(metrics["val/perplexity"])
            if spec.importance:
                # the depth-statistics batch only: every block costs one forward of it (32 blocks ~ 11 steps)
                result.importance_base_loss, result.importance = layer_importance(module, val_batches[:1])
    except Exception as exc:  # noqa: BLE001 - one failed run is recorded and must not end the whole study
        log.error("study run %s failed:\n%s", spec.label, traceback.format_exc())
        result.status, result.error = "error", f"{type(exc).__name__}: {exc}"
    if monitor.diverged_step is not None:
        result.status = "diverged"
        result.diverged_step, result.diverged_loss = monitor.diverged_step, monitor.diverged_loss
    result.losses = list(monitor.losses)
    result.steps_done = max(result.steps_done, len(monitor.losses))
    result.tokens = monitor.tokens
    result.train_seconds = monitor.train_seconds if monitor.train_seconds > 0 else math.nan
    if monitor.tokens and result.train_seconds > 0:
        result.tokens_per_sec = monitor.tokens / result.train_seconds
    finite = [v for _, v in monitor.losses if math.isfinite(v)]
    if finite and result.status != "diverged":
        tail = max(1, min(len(finite), math.ceil(0.1 * spec.steps)))
        result.train_loss = sum(finite[-tail:]) / tail
    result.wall_seconds = time.perf_counter() - started
    (run_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return result
