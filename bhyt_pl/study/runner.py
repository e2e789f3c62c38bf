"""One study run: one Lightning fit of ``LlamaLM`` with a fixed seed, data and budget, with divergence
detection, depth statistics at initialisation and at the end, and a record that survives divergence.

Every run in a study trains through the same code path users train with (``LlamaLM`` + ``Trainer``);
runs follow one another in one process. What a run measures:

- ``train_loss``: the mean training loss over the last ``tail`` optimizer steps (a single step is noisy);
- ``val_loss`` / ``val_perplexity``: ``trainer.validate`` on a fixed list of validation batches, the same
  for every run (token-weighted mean, ``LlamaLM.validation_step``);
- ``tokens_per_sec``: training tokens / wall time of the training loop (model build, depth statistics
  and validation excluded; the first step, with its allocator warm-up, included);
- depth statistics (docs/method.md, section 6, paper Figure 3): ``DepthStatsCollector`` on one fixed batch, in
  eval mode, before the first step and after the last (magnitude = mean over tokens of ``||y_t||_2``,
  variance = mean over tokens of ``Var_d(y_t)``, ``y`` a block output);
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
from lightning.pytorch.loggers import CSVLogger
from typing_extensions import override

from bhyt_pl.callbacks import DepthStatsCollector
from bhyt_pl.module import LlamaLM
from bhyt_pl.norms import build_norm_scheme

__all__ = ["DivergenceMonitor", "RunResult", "RunSpec", "TrainerSettings", "depth_statistics", "run_dirname", "run_one"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """What one run trains: plain data, written into the run's ``result.json``.

    Args:
        label: unique name of the run (also its log directory), e.g. ``bhyt`` or ``bhyt-L16-lr0.003``.
        norm: registered norm scheme.
        norm_args: the scheme's constructor arguments.
        preset: model preset (``bhyt_pl.PRESETS``).
        overrides: ``LlamaConfig`` fields replacing the preset's (e.g. ``{"n_layers": 8}``).
        lr: peak learning rate (cosine to ``lr * min_lr_ratio``, linear warmup).
        steps: optimizer steps.
        seed: ``seed_everything`` before the model is built; the data module has its own seed.
        max_loss: divergence bound on the training loss (NaN/inf always diverges).
        warmup_ratio, min_lr_ratio, weight_decay, grad_clip: optimisation settings as in ``recipes/tiny.yaml``.
    """

    label: str
    norm: str
    norm_args: dict[str, Any] = field(default_factory=dict)
    preset: str = "deep-32x128"
    overrides: dict[str, Any] = field(default_factory=dict)
    lr: float = 3e-3
    steps: int = 200
    seed: int = 42
    max_loss: float = 12.0
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True)
class TrainerSettings:
    """Hardware settings shared by every run (``L.Trainer`` arguments)."""

    accelerator: str = "cpu"
    devices: int | str = 1
    precision: str = "32-true"
    log_every_n_steps: int = 10
    progress_bar: bool = False


@dataclass
class RunResult:
    """What one run produced. ``status`` is ``ok``, ``diverged`` or ``error``; NaN where not measured."""

    spec: RunSpec
    status: str = "ok"
    n_layers: int = 0
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


def layer_series(stats: dict[str, float], stat: str) -> list[float]:
    """``[value of layer 0, layer 1, ...]`` of one statistic from ``DepthStatsCollector.compute`` keys."""
    points = {int(k.rsplit("_", 1)[1]): v for k, v in stats.items() if k.startswith(f"{stat}/layer_")}
    return [points[i] for i in sorted(points)]


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


@torch.no_grad()
def depth_statistics(module: LlamaLM, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """``DepthStatsCollector`` statistics of ``module``'s Llama on one batch, in eval mode.

    Returns:
        ``{"magnitude/layer_00": value, "variance/layer_00": ..., ...}``.
    """
    model = module.model
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        with DepthStatsCollector(model) as collector:
            model(batch["input_ids"].to(device))
        return collector.compute()
    finally:
        model.train(was_training)


def _variance_bound(spec: RunSpec, module: LlamaLM) -> dict[str, Any] | None:
    """The theorem condition ``lambda/kappa < 1/sqrt(L)`` for BHyT schemes, at the initial and the learned lambdas."""
    scheme = build_norm_scheme(spec.norm, **spec.norm_args)
    report = getattr(scheme, "variance_bound_report", None)
    if not callable(report):
        return None
    n_layers = module.config.n_layers
    kappa = float(scheme.kappa_value)
    learned: dict[str, float] = {}
    for site in ("attn_in", "mlp_in"):
        values = [float(getattr(layer.norms, site).lambda_.detach().abs().max()) for layer in module.model.layers]
        learned[site] = max(values)
    threshold = 1.0 / math.sqrt(n_layers)
    return {
        "n_layers": n_layers,
        "kappa": kappa,
        "lambda_attn": scheme.lambda_attn,
        "lambda_mlp": scheme.lambda_mlp,
        "threshold": threshold,
        "at_init": report(n_layers),
        "learned_max_lambda_attn": learned["attn_in"],
        "learned_max_lambda_mlp": learned["mlp_in"],
        "learned_holds": all(v / kappa < threshold for v in learned.values()),
    }


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
        datamodule_factory: ``() -> LightningDataModule``: a fresh data module with the study's data,
            seed, sequence length and batch size (each run sees the same batches in the same order).
        val_batches: fixed validation batches; the first is the depth-statistics batch.
        settings: accelerator, devices, precision.
        out_dir: the study folder; logs go to ``out_dir/runs/<label>/``.
    """
    result = RunResult(spec=spec)
    run_dir = out_dir / "runs" / run_dirname(spec.label)
    run_dir.mkdir(parents=True, exist_ok=True)
    monitor = DivergenceMonitor(spec.max_loss)
    try:
        L.seed_everything(spec.seed, verbose=False)
        datamodule = datamodule_factory()
        module = LlamaLM(
            preset=spec.preset,
            overrides=dict(spec.overrides),
            norm=spec.norm,
            norm_args=dict(spec.norm_args),
            seq_len=datamodule.seq_len,
            tokenizer=datamodule.tokenizer,
            lr=spec.lr,
            min_lr_ratio=spec.min_lr_ratio,
            warmup_ratio=spec.warmup_ratio,
            weight_decay=spec.weight_decay,
        )
        module.configure_model()  # built now (fit keeps it): the initial statistics see the weights that train
        result.n_layers = module.config.n_layers
        result.depth_init = depth_statistics(module, val_batches[0])
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
            logger=logger,
            callbacks=[monitor],
            enable_checkpointing=False,
            enable_progress_bar=settings.progress_bar,
            enable_model_summary=False,
        )
        trainer.fit(module, datamodule=datamodule)
        result.steps_done = trainer.global_step
        result.depth_final = depth_statistics(module, val_batches[0])
        result.variance_bound = _variance_bound(spec, module)
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
            metrics = validator.validate(module, dataloaders=loader, verbose=False)[0]
            result.val_loss = float(metrics["val/loss"])
            result.val_perplexity = float(metrics["val/perplexity"])
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
    (run_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return result
