"""How the submitit launchers read a job's state (``bhyt_pl.study.launch.job_states``), and that nothing in the study
branches on which executor runs it: each executor's launcher subclass says what differs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bhyt_pl.study.launch.job_states import (
    LOCAL_ENDED,
    SLURM_ENDED,
    SLURM_QUEUED,
    SLURM_RUNNING,
    JobPhase,
    local_phase,
    slurm_phase,
)

STUDY = Path(__file__).resolve().parents[2] / "bhyt_pl" / "study"


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        ("PENDING", JobPhase.QUEUED),
        ("REQUEUED", JobPhase.QUEUED),
        ("SUSPENDED", JobPhase.QUEUED),
        ("RUNNING", JobPhase.RUNNING),
        ("COMPLETING", JobPhase.RUNNING),
        ("COMPLETED", JobPhase.ENDED),
        ("CANCELLED", JobPhase.ENDED),
        ("PREEMPTED", JobPhase.ENDED),
        ("OUT_OF_MEMORY", JobPhase.ENDED),
        ("", JobPhase.MISSING),
        ("SOMETHING_NEW", JobPhase.UNKNOWN),
    ],
)
def test_slurm_states_map_to_phases(state: str, phase: JobPhase) -> None:
    assert slurm_phase(state) is phase


def test_every_slurm_state_has_one_phase_and_only_queued_and_running_jobs_go_on() -> None:
    assert not (SLURM_QUEUED & SLURM_RUNNING or SLURM_QUEUED & SLURM_ENDED or SLURM_RUNNING & SLURM_ENDED)
    assert {slurm_phase(s) for s in SLURM_ENDED} == {JobPhase.ENDED}
    assert [p for p in JobPhase if not p.is_over] == [JobPhase.QUEUED, JobPhase.RUNNING]


def test_local_job_states_map_to_phases() -> None:
    assert local_phase("RUNNING") is JobPhase.RUNNING
    assert {local_phase(s) for s in LOCAL_ENDED} == {JobPhase.ENDED} and LOCAL_ENDED == {"FINISHED", "INTERRUPTED"}
    assert local_phase("PENDING") is JobPhase.UNKNOWN  # no queue on this machine: not a local job's state


EXECUTOR_BRANCHES = [
    re.compile(r"\bcluster\s*(==|!=|\bin\b|\bnot in\b)"),
    re.compile(r"\.(cluster|executor)\s*(==|!=|\bin\b|\bnot in\b)"),
    re.compile(r"(==|!=)\s*[\"'](slurm|local)[\"']"),
    re.compile(r"[\"'](slurm|local)[\"']\s*(==|!=)"),
    re.compile(r"\bis_slurm\b|\bis_local\b|\bCLUSTERS\b"),
    re.compile(r"SUBMITIT_EXECUTOR"),
]


def test_the_study_never_branches_on_the_executors_kind() -> None:
    found = [
        f"{path.relative_to(STUDY)}:{number}: {line.strip()}"
        for path in sorted(STUDY.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(pattern.search(line) for pattern in EXECUTOR_BRANCHES)
    ]
    assert found == []


def test_the_branch_check_catches_each_spelling() -> None:
    lines = ['if settings.cluster == "slurm":', "if cluster in CLUSTERS:", 'x = "local" != kind', "if s.is_slurm:"]
    assert all(any(p.search(line) for p in EXECUTOR_BRANCHES) for line in lines)
