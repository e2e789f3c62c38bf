"""One study run: one Lightning fit of ``LlamaLM`` with a fixed seed, data and budget, with divergence
detection, depth statistics along training, StabilityMonitor's columns, layer importance at the end,
and a record that survives divergence.

Every run in a study trains through the same code path users train with (``LlamaLM`` + ``Trainer``);
runs follow one another in one process. What a run measures:

- ``train_loss``: the mean training loss over the last ``tail`` optimizer steps (a single step is noisy);
- ``val_loss`` / ``val_perplexity``: ``trainer.validate`` on a fixed list of validation batches, the same
  for every run (token-weighted mean, ``LlamaLM.validation_step``), and each batch's own loss
  (``val_batch_losses``: how much of a difference between runs the validation tokens carry);
- its size: the parameter counts of its built model (P, the embedding, everything), tokens per parameter and, on
  the embedded corpus, unique tokens and epochs (``bhyt_pl.study.protocol.size``);
- ``tokens_per_sec``: training tokens / wall time of the training loop (model build, depth statistics
  and validation excluded; the first step, with its allocator warm-up, included);
- depth statistics before the first step and after the last, and trajectories: the depth statistics and the
  validation loss at step 0, every ``trajectory_every`` optimizer steps (``TrajectoryRecorder``) and at the end
  (``bhyt_pl.study.run.measure``);
- stability: ``StabilityMonitor`` on the training batch (``stability_every`` steps): the spike counts,
  the layer with the largest gradient norm and the last layer's attention entropy at each logging step;
- layer importance at the end (``bhyt_pl.study.run.measure.layer_importance``);
- divergence: ``DivergenceMonitor`` stops the fit at the first optimizer step whose loss is NaN/inf or
  above ``max_loss``; the step and loss are recorded and the logs written so far are kept.

A run writes ``runs/<label>/result.json`` atomically (whole or absent) when it ends. A run whose job is asked to
stop (preemption, time limit: ``bhyt_pl.study.run.preemption``) writes no result: it saves ``runs/<label>/last.ckpt``
at the end of its current step (Lightning's state, the data's position, every callback's state, the in-memory
metrics and the initial depth statistics) and raises ``RunPreempted``; run again with the same spec, it resumes
there and records what an uninterrupted run records, timings excepted (``run_one``). The CSV metrics of the
tries before a resume stay beside the new ones (``logs/metrics.until-step-<N>.csv``).
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

from bhyt_pl.callbacks.stability import StabilityMonitor
from bhyt_pl.data import C4DataModule
from bhyt_pl.model_size import ModelSize, tokens_per_param
from bhyt_pl.module import LlamaLM
from bhyt_pl.run_config import data_run_facts
from bhyt_pl.strict_json import write as write_json
from bhyt_pl.study.protocol.metrics import trajectory_point
from bhyt_pl.study.protocol.size import epochs, unique_tokens
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, RunStatus, TrainerSettings, run_dirname
from bhyt_pl.study.run.callbacks import DivergenceMonitor, MemoryLogger, TrajectoryRecorder
from bhyt_pl.study.run.measure import (
    batch_losses,
    depth_statistics,
    layer_importance,
    stability_summary,
    variance_bound,
)
from bhyt_pl.study.run.preemption import RunCheckpointOnPreemption, saved_run_state

__all__ = [
    "COMPILE_LOSS_TOLERANCE",
    "PREEMPTED_CHECKPOINT",
    "RunResult",
    "RunSpec",
    "TrainerSettings",
    "build_module",
    "run_dirname",
    "run_one",
]

COMPILE_LOSS_TOLERANCE = 2e-3
"""Largest absolute difference between a compiled and an eager run's training loss at any step, and their
validation loss, over a short run (same seed, data and spec; 8 steps in tests/study/test_runner.py). Inductor's
fused float32 kernels round differently, and training amplifies that step by step: over the default study's
180 steps the two paths end like two nearby trajectories, not like two seeds (docs/performance.md, "Study
run": validation losses 0.009 apart where seeds spread 0.04)."""

PREEMPTED_CHECKPOINT = "last.ckpt"
"""The whole state of a preempted run, in its run folder; removed once the run has its ``result.json``."""

log = logging.getLogger(__name__)


def build_module(spec: RunSpec, datamodule: L.LightningDataModule, compile: bool) -> LlamaLM:
    """The ``LlamaLM`` a study run trains: the spec's model, scheme and schedule, with the data's run facts and
    tokenizer. The dry run's pace probe (``bhyt_pl.study.cli.estimate``) trains the same module."""
    return LlamaLM(
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
        compile=compile,
    )


def run_one(
    spec: RunSpec,
    datamodule_factory: Callable[[int], L.LightningDataModule],
    val_batches: list[dict[str, torch.Tensor]],
    settings: TrainerSettings,
    out_dir: Path,
) -> RunResult:
    """Train one run and measure it. Never raises for a failure of the run itself (recorded as ``error``).

    Checkpointable: inside a job asked to stop (``bhyt_pl.study.run.preemption.preemption_requested``), the run saves
    itself to ``runs/<label>/last.ckpt`` at the end of the current optimizer step and raises ``RunPreempted``
    (no ``result.json``). Called again with the same spec, it resumes from that checkpoint and ends with the
    result of an uninterrupted run (bit for bit in eager mode; within ``COMPILE_LOSS_TOLERANCE`` compiled). Its
    ``train_seconds`` add every try's training loop and ``wall_seconds`` every try's time from the start of
    ``run_one`` to the save (the last try's to its end), so ``tokens_per_sec`` is the tries' throughput and
    neither counts the time between two tries (queueing, the job's start). A checkpoint saved for another spec is
    deleted and the run starts over; once ``result.json`` is written (any status), the checkpoint is removed.

    Args:
        spec: the run.
        datamodule_factory: ``(data_seed) -> LightningDataModule``: a fresh data module with the study's
            data, sequence length and batch size, shuffled with ``data_seed`` (runs with the same data seed
            see the same batches in the same order).
        val_batches: fixed validation batches: validation loss and depth statistics at every trajectory point.
        settings: accelerator, devices, precision.
        out_dir: the study folder; logs go to ``out_dir/runs/<label>/``.

    Raises:
        RunPreempted: the job was asked to stop; the run saved its state and is to be called again.
    """
    result = RunResult(spec=spec)
    run_dir = out_dir / "runs" / run_dirname(spec.label)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = run_dir / PREEMPTED_CHECKPOINT
    _drop_stale_checkpoint(run_dir, checkpoint)
    spec_data = json.loads(json.dumps(asdict(spec), default=str))
    monitor = DivergenceMonitor(spec.max_loss)
    recorder = TrajectoryRecorder(val_batches, spec.trajectory_every) if spec.trajectory_every > 0 else None
    memory = MemoryLogger()
    started = time.perf_counter()
    earlier_seconds = 0.0  # wall seconds of the tries this one resumes

    def run_state() -> dict[str, dict[str, float] | float]:  # what the checkpoint carries besides Lightning's state
        return {"depth_init": result.depth_init, "wall_seconds": earlier_seconds + time.perf_counter() - started}

    try:
        saved = saved_run_state(checkpoint, spec_data)
        if saved is not None:
            earlier_seconds = float(saved["wall_seconds"])
        if settings.compile:
            # each run traces its own graphs (compiled kernels come from the Inductor cache on disk): a run does not
            # depend on what ran before it, and a worker's many schemes never reach dynamo's recompile limit
            torch.compiler.reset()
        L.seed_everything(spec.seed, verbose=False)
        datamodule = datamodule_factory(spec.data_seed)
        module = build_module(spec, datamodule, settings.compile)
        module.configure_model()  # built now (fit keeps it): the initial statistics see the weights that train
        result.n_layers, result.dim = module.config.n_layers, module.config.dim
        size = ModelSize.of(module.config, module.model)
        result.block_params, result.embedding_params = size.block_params, size.embedding_params
        result.total_params = size.total_params
        result.corpus_tokens = datamodule.training_tokens_per_epoch() if isinstance(datamodule, C4DataModule) else None
        if saved is None:
            result.depth_init = depth_statistics(module, val_batches)
            if recorder is not None:
                recorder.points.append(trajectory_point(0, result.depth_init))
        else:  # the recorder's points, step 0's included, come back with the checkpoint
            result.depth_init = saved["depth_init"]
            _keep_earlier_csv(run_dir / "logs", saved.get("step"))
        callbacks: list[L.Callback] = [monitor] + ([recorder] if recorder is not None else [])
        if spec.stability_every > 0:
            stability = StabilityMonitor(
                every_n_steps=spec.stability_every,
                figures=False,
                spike_window=spec.spike_window,
                spike_min_history=max(2, spec.spike_window // 2),
            )
            callbacks.append(stability)  # its logging steps run eagerly when the blocks are compiled
        # last: the step's records above are in the checkpoint it saves
        callbacks.append(RunCheckpointOnPreemption(checkpoint, spec_data, memory, run_state))
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
            enable_checkpointing=False,  # the preemption callback saves, only when asked to stop
            enable_progress_bar=settings.progress_bar,
            enable_model_summary=False,
        )
        resume_from = checkpoint if saved is not None else None
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=False)  # our own file
        except SystemExit:
            if trainer.interrupted:  # Lightning turns Ctrl-C into sys.exit(1); the study stops as interrupted
                raise KeyboardInterrupt from None
            raise
        result.steps_done = trainer.global_step
        result.depth_final = depth_statistics(module, val_batches)
        points = list(recorder.points) if recorder is not None else [trajectory_point(0, result.depth_init)]
        if monitor.diverged_step is None:  # a diverged run's end point is not a trained model's
            points.append(trajectory_point(result.steps_done, result.depth_final))
        result.trajectory = points
        result.variance_bound = variance_bound(module)
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
            result.val_batch_losses = batch_losses(module, val_batches)
            if spec.importance:
                # the depth-statistics batch only: every block costs one forward of it (32 blocks ~ 11 steps)
                result.importance_base_loss, result.importance = layer_importance(module, val_batches[:1])
    except Exception as exc:  # noqa: BLE001 - one failed run is recorded and must not end the whole study
        log.error("study run %s failed:\n%s", spec.label, traceback.format_exc())
        result.status, result.error = RunStatus.ERROR, f"{type(exc).__name__}: {exc}"
    if monitor.diverged_step is not None:
        result.status = RunStatus.DIVERGED
        result.diverged_step, result.diverged_loss = monitor.diverged_step, monitor.diverged_loss
    result.losses = list(monitor.losses)
    result.steps_done = max(result.steps_done, len(monitor.losses))
    result.tokens = monitor.tokens
    if result.block_params:
        result.tokens_per_param = tokens_per_param(result.tokens, result.block_params)
    result.unique_tokens = unique_tokens(result.tokens, result.corpus_tokens)
    result.epochs = epochs(result.tokens, result.corpus_tokens)
    result.train_seconds = monitor.train_seconds if monitor.train_seconds > 0 else math.nan
    if monitor.tokens and result.train_seconds > 0:
        result.tokens_per_sec = monitor.tokens / result.train_seconds
    finite = [v for _, v in monitor.losses if math.isfinite(v)]
    if finite and result.status != RunStatus.DIVERGED:
        tail = max(1, min(len(finite), math.ceil(0.1 * spec.steps)))
        result.train_loss = sum(finite[-tail:]) / tail
    result.wall_seconds = earlier_seconds + time.perf_counter() - started
    _write_result(run_dir / "result.json", result)
    checkpoint.unlink(missing_ok=True)  # a run with a result keeps only its result
    return result


def _write_result(path: Path, result: RunResult) -> None:
    """``result.json`` (strict JSON) whole or absent: a job killed while writing it leaves the previous file or none."""
    write_json(path, result.to_dict())


def _drop_stale_checkpoint(run_dir: Path, checkpoint: Path) -> None:
    """Removes what an interrupted save left (temporary files) and a checkpoint older than the run's result: the
    run finished after that save and was stopped before it removed the checkpoint, which must not be resumed."""
    for leftover in run_dir.glob(f".{checkpoint.name}.*.tmp"):
        leftover.unlink(missing_ok=True)
    for leftover in run_dir.glob(".result.json.*.tmp"):
        leftover.unlink(missing_ok=True)
    result = run_dir / "result.json"
    if checkpoint.is_file() and result.is_file() and result.stat().st_mtime >= checkpoint.stat().st_mtime:
        log.warning("study run: %s is older than the run's result.json; deleted, the run starts over", checkpoint)
        checkpoint.unlink()


def _keep_earlier_csv(log_dir: Path, step: int | None) -> None:
    """Keeps the CSV metrics of the tries before a resume (Lightning's CSV logger deletes ``metrics.csv``)."""
    metrics = log_dir / "metrics.csv"
    if metrics.is_file():
        metrics.replace(log_dir / f"metrics.until-step-{step}.csv")
