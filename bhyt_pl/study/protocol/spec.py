"""The study's shared types: what one run trains (``RunSpec``), how it executes (``TrainerSettings``), what it
produced (``RunResult``, ``RunStatus``) and its name (``run_label``, ``run_dirname``).

Every stage reads them (design, plan, claims, the launchers, the record, the report), so they sit at the bottom
of the study and import neither Lightning nor submitit: a statistics or rendering module loads without either.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NotRequired, TypedDict

from bhyt_pl.callbacks.layer_metrics import layer_series

__all__ = [
    "RunResult",
    "RunSpec",
    "RunStatus",
    "StabilityStep",
    "StabilitySummary",
    "TrainerSettings",
    "TrajectoryPoint",
    "VarianceBound",
    "VarianceBoundCheck",
    "legacy_label",
    "run_dirname",
    "run_label",
]


class RunStatus(str, enum.Enum):
    """How a run ended: ``ok`` (trained to its last step), ``diverged`` (stopped at a NaN/inf or over-bound loss:
    a result, not a failure) or ``error`` (an exception: no result). A ``str`` so ``result.json`` stays plain."""

    OK = "ok"
    DIVERGED = "diverged"
    ERROR = "error"

    __str__ = str.__str__
    __format__ = str.__format__


TrajectoryPoint = dict[str, float | list[float]]
"""One point of a run's trajectory (``bhyt_pl.study.protocol.metrics.trajectory_point``): ``step`` (an int),
``val_loss``, and under each statistic recorded along training (a registry name, hence not a ``TypedDict``) its
per-layer profile."""


class VarianceBoundCheck(TypedDict):
    """The theorem condition ``lambda / kappa < 1 / sqrt(L)`` for each site's initial lambda, and for both."""

    lambda_attn: bool
    lambda_mlp: bool
    all: bool


class VarianceBound(TypedDict):
    """A scheme's ``variance_bound`` diagnostic (BHyT's ``diagnostics``): the condition at the initial lambdas
    and, once the model has trained, at the largest learned ``|lambda|`` of each site."""

    n_layers: int
    kappa: float
    lambda_attn: float
    lambda_mlp: float
    threshold: float
    at_init: VarianceBoundCheck
    learned_max_lambda_attn: NotRequired[float]
    learned_max_lambda_mlp: NotRequired[float]
    learned_holds: NotRequired[bool]


class StabilityStep(TypedDict):
    """The stability monitor at one logging step: the block (1-based) with the largest gradient norm (None when
    no norm was finite), that norm, and the last layer's attention entropy."""

    step: int
    max_grad_layer: int | None
    max_grad_norm: float
    last_attn_entropy: float


class StabilitySummary(TypedDict, total=False):
    """A run's stability record (``bhyt_pl.study.run.measure.stability_summary``): final spike counts and the
    per-step columns; empty for a run trained without the stability monitor."""

    loss_spikes: int
    grad_norm_spikes: int
    steps: list[StabilityStep]


@dataclass(frozen=True)
class RunSpec:
    """What one run trains: plain data, written into the run's ``result.json``.

    Args:
        label: unique name of the run (also its log directory), e.g. ``bhyt@lr0.003-steps180-s1``
            (``plan.run_label``) or ``bhyt@L16-lr0.003-steps100-s0`` (the sweep).
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
    norm_args: dict[str, object] = field(default_factory=dict)
    preset: str = "deep-32x128"
    overrides: dict[str, object] = field(default_factory=dict)
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
    """What one run produced; NaN where not measured. ``val_batch_losses``: the validation loss of each fixed batch
    (empty in a record written before it was measured).

    Its size (``bhyt_pl.study.protocol.size``; 0, NaN or None in a record written before it was measured):
    ``block_params`` (P, the blocks' weight matrices), ``embedding_params`` and ``total_params`` (every parameter of
    its built model) from ``bhyt_pl.model_size``; ``tokens`` trained and ``tokens_per_param`` (T/P, ``tokens / P``);
    ``corpus_tokens``, the training tokens one pass over its data gives (None when unknown: only the embedded
    corpus is counted), with ``unique_tokens`` (at most one pass's) and ``epochs`` (``tokens / corpus_tokens``).
    """

    spec: RunSpec
    status: RunStatus = RunStatus.OK
    n_layers: int = 0
    dim: int = 0
    steps_done: int = 0
    diverged_step: int | None = None
    diverged_loss: float | None = None
    error: str | None = None
    train_loss: float = math.nan
    val_loss: float = math.nan
    val_perplexity: float = math.nan
    val_batch_losses: list[float] = field(default_factory=list)
    tokens: int = 0
    block_params: int = 0
    embedding_params: int = 0
    total_params: int = 0
    tokens_per_param: float = math.nan
    corpus_tokens: int | None = None
    unique_tokens: int | None = None
    epochs: float | None = None
    train_seconds: float = math.nan
    tokens_per_sec: float = math.nan
    losses: list[tuple[int, float]] = field(default_factory=list)
    depth_init: dict[str, float] = field(default_factory=dict)
    depth_final: dict[str, float] = field(default_factory=dict)
    variance_bound: VarianceBound | None = None
    trajectory: list[TrajectoryPoint] = field(default_factory=list)
    stability: StabilitySummary = field(default_factory=StabilitySummary)
    importance: list[float] = field(default_factory=list)
    importance_base_loss: float = math.nan
    wall_seconds: float = math.nan
    log_dir: str | None = None

    def __post_init__(self) -> None:
        self.status = RunStatus(self.status)  # "ok" from a record or a caller reads as RunStatus.OK

    @property
    def diverged(self) -> bool:
        return self.status == RunStatus.DIVERGED

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunResult:
        """The result ``to_dict`` wrote, read back from JSON (hence ``Any``: its fields' types are the ones above)."""
        data = dict(data)
        data["spec"] = RunSpec(**data["spec"])
        data["status"] = RunStatus(data.get("status", RunStatus.OK))
        data["losses"] = [tuple(x) for x in data.get("losses", [])]
        return cls(**data)

    def last_layer(self, stat: str, which: str = "final") -> float:
        """``stat`` (``magnitude``, ``variance``, ...) of the last block, at ``init`` or ``final``."""
        values = layer_series(self.depth_init if which == "init" else self.depth_final, stat)
        return values[-1] if values else math.nan


def run_dirname(label: str) -> str:
    """A file-system-safe directory name for a run label (``bhyt:lambda_attn=0.5`` -> ``bhyt_lambda_attn=0.5``)."""
    return re.sub(r"[^A-Za-z0-9_.=@+-]+", "_", label)


def run_label(candidate: str, lr: float, steps: int, seed_index: int) -> str:
    """``<candidate>@lr<lr>-steps<steps>-s<seed index>``: unique within a study folder and stable across re-runs
    (resume). The step count is part of it, so a longer run of the same candidate, rate and seed (540 steps
    beside 180) is a run of its own and never overwrites the shorter one's folder."""
    return f"{candidate}@lr{lr:g}-steps{steps}-s{seed_index}"


def legacy_label(spec: RunSpec) -> str:
    """The label ``spec`` had before labels carried the step count (``<candidate>@lr<lr>-s<seed index>``, the
    sweep's ``<candidate>@L<depth>-lr<lr>-s<seed index>``): what a study folder made then names its run."""
    head, sep, tail = spec.label.rpartition(f"-steps{spec.steps}-s")
    return f"{head}-s{tail}" if sep else spec.label
