"""Where and how a study's runs execute as submitit jobs: the settings every submitit executor shares
(``ClusterSettings``), and those of each executor the study uses (``SlurmSettings``, ``LocalSettings``).

Names follow submitit's ``AutoExecutor``. Every run is one single-node, single-task job. A settings class holds
only the fields its executor applies: ``LocalSettings(partition="gpu")`` is a ``TypeError`` naming the field,
and ``from_values`` (the command line's path) leaves out, and names, what its executor does not use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from bhyt_pl.validation import raise_if_problems

__all__ = ["ClusterSettings", "ExecutorParameters", "LocalSettings", "SbatchLines", "SlurmSettings"]

SbatchLines = dict[str, str | bool]
"""Extra ``#SBATCH`` lines: ``{"flag": value}``; ``True`` writes a bare flag."""

ExecutorParameters = dict[str, str | int | float | list[str] | SbatchLines]
"""Keyword arguments of submitit's ``Executor.update_parameters``."""


@dataclass(frozen=True)
class ClusterSettings:
    """What every submitit executor of the study applies: time limit, resources, throttle, retries and timings.

    A base: the study builds ``SlurmSettings`` or ``LocalSettings``, the settings of the executor it runs on.
    """

    executor: ClassVar[str] = ""
    """submitit's name of the executor (``AutoExecutor(cluster=...)``)."""

    timeout_min: int = 60
    """Time limit of one job, in minutes. A job that reaches it is requeued and resumes (checkpointable runs);
    the local executor's default of 2 minutes would kill a run under load, so it is always set."""
    gpus_per_node: int = 0
    """GPUs per run (a run is a one-node job)."""
    cpus_per_task: int = 1
    """CPUs per run; torch's threads inside the job follow it."""
    max_concurrent: int = 0
    """Most runs of the study running at once (0: no cap): a SLURM job array's ``%N`` throttle, and the
    launcher holds back runs while earlier jobs fill the cap."""
    retries: int = 2
    """Tries after a run's first one fails (a crashed, killed or lost job, or a result with status ``error``)."""
    lost_after_s: float = 600.0
    """A job with no accounting entry and no result for this long is lost: cancelled and resubmitted."""
    poll_interval_s: float = 30.0
    """Seconds between two ``sacct`` calls (one call covers every job of the study)."""
    result_wait_s: float = 15.0
    """How long a job that ended is waited on for its result file to appear (a shared filesystem lags;
    submitit waits 15 s as well)."""
    signal_delay_s: int = 120
    """Seconds before the time limit at which SLURM sends submitit's ``USR2``: the run has half of it to
    save its state at the end of a step, then submitit requeues the job."""

    def __post_init__(self) -> None:
        raise_if_problems("cluster settings", self.problems())

    def problems(self) -> list[str]:
        """What is wrong with these settings, one line per field (empty: nothing); subclasses add theirs."""
        problems = []
        minimum = {"timeout_min": 1, "gpus_per_node": 0, "cpus_per_task": 1, "max_concurrent": 0, "retries": 0}
        for name, lowest in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                problems.append(f"{name} must be an integer >= {lowest}, got {value!r}")
        for name in ("lost_after_s", "poll_interval_s", "result_wait_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                problems.append(f"{name} must be a number of seconds > 0, got {value!r}")
        if not isinstance(self.signal_delay_s, int) or not 0 <= self.signal_delay_s:
            problems.append(f"signal_delay_s must be an integer >= 0, got {self.signal_delay_s!r}")
        elif isinstance(self.timeout_min, int) and self.signal_delay_s >= 60 * self.timeout_min:
            problems.append(
                f"signal_delay_s ({self.signal_delay_s}) must be shorter than the time limit "
                f"(timeout_min {self.timeout_min} = {60 * self.timeout_min} s)"
            )
        return problems

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> tuple[ClusterSettings, list[str]]:
        """Settings from ``values`` (field name -> value), and the names of the values set there (not None, not
        empty) that this executor does not use: left out, for the caller to warn about."""
        names = {f.name for f in dataclasses.fields(cls)}
        ignored = [name for name, value in values.items() if name not in names and value]
        return cls(**{name: value for name, value in values.items() if name in names}), ignored

    def executor_parameters(self, study: str) -> ExecutorParameters:
        """The ``AutoExecutor.update_parameters`` arguments for this study's jobs (the throttle excepted)."""
        parameters: ExecutorParameters = {
            "name": study,
            "timeout_min": self.timeout_min,
            "nodes": 1,
            "tasks_per_node": 1,
            "cpus_per_task": self.cpus_per_task,
        }
        if self.gpus_per_node:  # no --gpus-per-node=0 line: some clusters reject a zero GPU request
            parameters["gpus_per_node"] = self.gpus_per_node
        return parameters


@dataclass(frozen=True)
class LocalSettings(ClusterSettings):
    """Settings of submitit's local executor: one process per run on this machine, no queue and no accounting.

    Example:
        >>> LocalSettings(timeout_min=30).executor_parameters("depth")["timeout_min"]
        30
    """

    executor: ClassVar[str] = "local"


@dataclass(frozen=True)
class SlurmSettings(ClusterSettings):
    """Settings of a SLURM cluster's jobs (``sbatch`` job arrays): the shared ones plus partition, account, QOS,
    memory, extra ``#SBATCH`` lines, shell setup lines and the signal delay.

    Example:
        >>> settings = SlurmSettings(partition="gpu", timeout_min=240, gpus_per_node=1, cpus_per_task=8)
        >>> settings.executor_parameters("depth")["slurm_partition"]
        'gpu'
    """

    executor: ClassVar[str] = "slurm"

    partition: str | None = None
    """SLURM partition (``slurm_partition``)."""
    account: str | None = None
    """SLURM account charged (``slurm_account``)."""
    qos: str | None = None
    """SLURM quality of service (``slurm_qos``)."""
    mem_gb: float | None = None
    """Memory per run in GB (None: the partition's default)."""
    additional_parameters: SbatchLines = field(default_factory=dict)
    """Extra ``#SBATCH`` lines as ``{"flag": value}`` (``slurm_additional_parameters``), e.g.
    ``{"constraint": "a100", "mail-type": "FAIL"}``; ``True`` writes a bare flag."""
    setup: tuple[str, ...] = ()
    """Shell lines run in the job before the run (``slurm_setup``), e.g. ``("module load cuda/12.4",)``."""

    def __post_init__(self) -> None:
        if isinstance(self.setup, str):
            raise TypeError(f"setup must be a list of shell lines, got the string {self.setup!r}; wrap it in a list")
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "additional_parameters", dict(self.additional_parameters))
        super().__post_init__()

    def problems(self) -> list[str]:
        problems = []
        for name in ("partition", "account", "qos"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                problems.append(f"{name} must be a non-empty name or None, got {value!r}")
        problems += super().problems()
        if self.mem_gb is not None and (not isinstance(self.mem_gb, int | float) or not self.mem_gb > 0):
            problems.append(f"mem_gb must be a number > 0 or None, got {self.mem_gb!r}")
        if not all(isinstance(line, str) for line in self.setup):
            problems.append(f"setup must hold shell lines (strings), got {list(self.setup)!r}")
        if not all(isinstance(key, str) and key for key in self.additional_parameters):
            problems.append(f"additional_parameters keys must be sbatch flag names, got {self.additional_parameters!r}")
        return problems

    def executor_parameters(self, study: str) -> ExecutorParameters:
        parameters = super().executor_parameters(study)
        optional = {"partition": self.partition, "account": self.account, "qos": self.qos}
        parameters.update({f"slurm_{k}": v for k, v in optional.items() if v is not None})
        if self.mem_gb is not None:
            parameters["mem_gb"] = self.mem_gb
        if self.additional_parameters:
            parameters["slurm_additional_parameters"] = dict(self.additional_parameters)
        if self.setup:
            parameters["slurm_setup"] = list(self.setup)
        parameters["slurm_signal_delay_s"] = self.signal_delay_s
        return parameters
