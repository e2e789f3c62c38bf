"""One invocation of the study, decided before any run trains: its budget, groups, roles, shared run settings,
data and trainer settings. ``bhyt_pl.study.cli.exploration`` builds it from the command line (``prepare``); the command,
the dry run (``bhyt_pl.study.cli.estimate``), the confirmation and the bench read it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from bhyt_pl.config import LlamaConfig
from bhyt_pl.study.protocol.design import SchemeGroup, StudyDesign
from bhyt_pl.study.protocol.plan import selection_specs, sweep_specs
from bhyt_pl.study.protocol.size import RunSize, run_sizes
from bhyt_pl.study.protocol.spec import RunSpec, TrainerSettings
from bhyt_pl.study.run.data import StudyData, fixed_batches

__all__ = ["Budget", "StudyOptions", "StudySetup", "loadavg_text"]


@dataclass(frozen=True)
class Budget:
    """The defaults of one mode; every field can be overridden on the command line."""

    preset: str
    layers: int | None
    steps: int
    seq_len: int
    batch_size: int
    val_batches: int
    lrs: tuple[float, ...]
    seeds: int
    trajectory_every: int
    depths: tuple[int, ...] = ()
    extensions: int = 1


@dataclass(frozen=True)
class StudyOptions:
    """How this invocation runs and what it reuses, beside what it studies: the options the setup's record, dry run
    and report read (the rest of the command line is resolved into the other fields of ``StudySetup``).

    Args:
        sweep, quick: the mode (``--sweep``, ``--quick``).
        out: ``--out`` (None: the mode's default folder).
        restart: ``--restart`` (retrain every run).
        matched_lrs: ``--matched-lrs`` (None: the default rule).
        workers, launcher, threads: ``--workers``, ``--launcher``, ``--threads``.
        data_files, tokenizer: the data as given (``--data-files``, ``--tokenizer``), for the record.
        mfu, peak_tflops, probe_steps: the dry run's assumptions (``--mfu``, ``--peak-tflops``, ``--probe-steps``).
    """

    sweep: bool = False
    quick: bool = False
    out: Path | None = None
    restart: bool = False
    matched_lrs: tuple[float, ...] | None = None
    workers: int | None = None
    launcher: str = "pool"
    threads: int | None = None
    data_files: str = "embedded"
    tokenizer: str = "embedded"
    mfu: float = 0.40
    peak_tflops: float = 989.0
    probe_steps: int = 5


@dataclass(frozen=True)
class StudySetup:
    """One invocation of the study, decided before any run trains: its budget, groups and roles, the settings its
    runs share (``base``: each run then sets its scheme, rate and seed), their data and how they execute.
    ``prepare`` builds it; ``main`` runs it, and ``python -m bhyt_pl bench --parts study_run`` times one of its
    runs.

    Args:
        argv: the command line it was built from (recorded in the report).
        options: how this invocation runs (mode, folder, launcher, dry-run assumptions).
        budget: the mode's defaults with the options applied.
        overrides: ``LlamaConfig`` fields every run sets (``--override``, ``--layers``).
        groups: the ``--schemes`` groups.
        roles: claim role -> group (``DEFAULT_ROLES`` with ``--roles`` applied).
        base: the settings every run shares.
        data: every run's data module (called with its data seed).
        settings: how every run executes (accelerator, devices, precision, compile).
    """

    argv: tuple[str, ...]
    options: StudyOptions
    budget: Budget
    overrides: dict[str, object]
    groups: tuple[SchemeGroup, ...]
    roles: dict[str, str]
    base: RunSpec
    data: StudyData
    settings: TrainerSettings

    @property
    def sweep(self) -> bool:
        return self.options.sweep

    @property
    def mode(self) -> str:
        return "study" + ("-sweep" if self.sweep else "") + ("-quick" if self.options.quick else "")

    @property
    def out(self) -> Path:
        """The report folder (``--out``, default ``runs/<mode>``)."""
        out = self.options.out
        return out if out is not None else Path("runs") / self.mode

    @property
    def config(self) -> LlamaConfig:
        return LlamaConfig.from_name(self.budget.preset, **self.overrides)

    def design(self) -> StudyDesign | None:
        """A fresh depth-study design (groups, grid, seeds; nothing selected yet); None for the sweep."""
        if self.sweep:
            return None
        return StudyDesign(self.groups, self.budget.lrs, self.budget.seeds, self.budget.extensions)

    def validation_batches(self) -> list[dict[str, torch.Tensor]]:
        """The fixed validation batches every run is measured on (from the base data seed's data module)."""
        return fixed_batches(self.data(self.base.data_seed), self.budget.val_batches)

    def sizes(self) -> list[RunSize]:
        """The size of its runs (``bhyt_pl.study.protocol.size``): one per model shape (the sweep: one per depth), with
        every candidate's parameter total, the tokens of a run and the training data's size where it is known."""
        budget = self.budget
        if self.sweep:
            specs = sweep_specs(self.groups, budget.depths, budget.lrs[:1], 1, self.base)
        else:
            specs = [spec for g in self.groups for spec in selection_specs(g, budget.lrs[:1], self.base)]
        tokens = budget.seq_len * budget.batch_size * budget.steps
        return run_sizes(specs, tokens, self.data.training_tokens_per_epoch())

    def meta(self) -> dict[str, object]:
        """What the report's head lists: the command, the budget, the size of its runs (``sizes``), the data, the
        machine and its load now (``unigram_loss`` is None until measured)."""
        from bhyt_pl.machine import machine_info

        budget, run, labels = self.budget, self.options, [g.label for g in self.groups]
        return {
            "command": "python -m bhyt_pl study " + shlex.join(self.argv),
            "mode": self.mode,
            "preset": budget.preset,
            "n_layers_label": "/".join(map(str, budget.depths)) if self.sweep else str(self.config.n_layers),
            "overrides": self.overrides,
            "steps": budget.steps,
            "seq_len": budget.seq_len,
            "batch_size": budget.batch_size,
            "tokens_per_step": budget.seq_len * budget.batch_size,
            "tokens_per_run": budget.seq_len * budget.batch_size * budget.steps,
            "size": [size.to_dict() for size in self.sizes()],
            "lrs": list(budget.lrs),
            "seeds": budget.seeds,
            "selection_seed": "index 0 (seed 42); evaluation seeds: indices 1..N (seeds 43..42+N)",
            "extensions": budget.extensions,
            "roles": {k: v for k, v in self.roles.items() if v in labels},
            "schemes": labels,
            "trajectory_every": self.base.trajectory_every,
            "workers": run.workers,
            "launcher": run.launcher,
            "compile": self.settings.compile,
            "data": f"{run.data_files} (tokenizer {run.tokenizer})",
            "validation": f"{budget.val_batches} fixed batches of {budget.batch_size} x {budget.seq_len}: validation "
            "loss and depth statistics at every trajectory point",
            "unigram_loss": None,
            "max_loss": round(self.base.max_loss, 4),
            "loadavg_at_start": loadavg_text(),
            "machine": machine_info(torch.device("cuda" if self.settings.accelerator in ("gpu", "cuda") else "cpu")),
        }


def loadavg_text() -> str:
    """The load average over 1, 5 and 15 minutes as ``/proc/loadavg`` writes it (``n/a`` where there is none): every
    timing the study records is read beside it."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"
