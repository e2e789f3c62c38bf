"""Where a submitit job is, as the study's submitit launchers read it: a scheduler's state word mapped to a phase.

SLURM's states (``sacct``'s ``State``, first word) map as:

=============================================================  =============================================
``PENDING``, ``REQUEUED``, ``REQUEUE_FED``, ``REQUEUE_HOLD``,  ``QUEUED``
``RESV_DEL_HOLD``, ``SUSPENDED``
``RUNNING``, ``COMPLETING``, ``CONFIGURING``, ``STAGE_OUT``,   ``RUNNING``
``SIGNALING``, ``RESIZING``, ``STOPPED``
``COMPLETED``, ``FAILED``, ``CANCELLED``, ``TIMEOUT``,         ``ENDED``: done with the job's result, else a
``NODE_FAIL``, ``OUT_OF_MEMORY``, ``BOOT_FAIL``, ``DEADLINE``,  failed try once no result has appeared for
``PREEMPTED``, ``REVOKED``, ``SPECIAL_EXIT``                   ``result_wait_s`` (a shared filesystem lags)
no entry                                                       ``MISSING``: lost after ``lost_after_s``
anything else                                                  ``UNKNOWN``: taken as queued, with a warning
=============================================================  =============================================

submitit's local executor has no queue and no accounting: a local job is ``RUNNING`` while its controller
process runs, then ``FINISHED`` (or ``INTERRUPTED``: the controller was killed), both ``ENDED``.
"""

from __future__ import annotations

import enum

__all__ = ["LOCAL_ENDED", "SLURM_ENDED", "SLURM_QUEUED", "SLURM_RUNNING", "JobPhase", "local_phase", "slurm_phase"]


class JobPhase(enum.Enum):
    """What a job's state means to the launcher."""

    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"
    MISSING = "missing"
    UNKNOWN = "unknown"

    @property
    def is_over(self) -> bool:
        """Whether nothing more will run in the job (a job the scheduler no longer knows counts as over)."""
        return self not in (JobPhase.QUEUED, JobPhase.RUNNING)


SLURM_QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED"})
SLURM_RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"})
SLURM_ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
LOCAL_ENDED = frozenset({"FINISHED", "INTERRUPTED"})
"""submitit's ``LocalJob`` states once the job's controller has exited."""


def slurm_phase(state: str) -> JobPhase:
    """The phase of a SLURM job from its ``sacct`` state, first word (``""``: no accounting entry)."""
    if not state:
        return JobPhase.MISSING
    if state in SLURM_QUEUED:
        return JobPhase.QUEUED
    if state in SLURM_RUNNING:
        return JobPhase.RUNNING
    if state in SLURM_ENDED:
        return JobPhase.ENDED
    return JobPhase.UNKNOWN


def local_phase(state: str) -> JobPhase:
    """The phase of a local job from its state (``RUNNING``, ``FINISHED`` or ``INTERRUPTED``)."""
    if state in LOCAL_ENDED:
        return JobPhase.ENDED
    return JobPhase.RUNNING if state == "RUNNING" else JobPhase.UNKNOWN
