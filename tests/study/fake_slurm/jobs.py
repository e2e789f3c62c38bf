"""Cheap stand-ins for ``run_one`` that jobs run: picklable (imported by name in the job), a ``RunSpec`` in, a
``RunResult`` out, in a fraction of a second plus the interpreter's start.

``spec.overrides`` steers them (all optional): ``dir`` (a folder for their traces), ``gate`` (a file to wait
for before finishing), ``fail_tries`` / ``error_tries`` (the first N calls raise / return status ``error``),
``interrupt_tries`` (the first N calls end with ``KeyboardInterrupt``, as a run does on SIGINT, and the process
prints a warning as it exits, the last line of its log), ``hold_at_step`` (``stepped_run``'s first start waits
at the end of that step until preemption is requested, so that the test's signal finds it there on a fast idle
machine as on a slow loaded one).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path

import torch

from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.study.run.preemption import RunPreempted, preemption_requested


def _call_number(spec: RunSpec) -> int:
    """How many times this run was called so far, this call included (a file per label in ``dir``)."""
    path = Path(spec.overrides["dir"]) / f"{spec.label}.calls"
    calls = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(calls))
    return calls


def _trace(spec: RunSpec, **facts: object) -> None:
    with open(Path(spec.overrides["dir"]) / f"{spec.label}.trace", "a") as f:
        f.write(json.dumps(facts) + "\n")


def expected_loss(spec: RunSpec) -> float:
    """The loss both run functions return: a closed form of the spec, independent of how the run was cut."""
    return sum((step + 1) * spec.lr for step in range(spec.steps)) + spec.seed


def stepped_loss(spec: RunSpec) -> float:
    """``stepped_run``'s loss without its sleeps, added in its order: an uninterrupted run's, to the bit."""
    loss = float(spec.seed)
    for step in range(spec.steps):
        loss += (step + 1) * spec.lr
    return loss


def quick_run(spec: RunSpec) -> RunResult:
    """Finishes at once (after ``gate``, if given), and records where and how it ran."""
    calls = _call_number(spec)
    started = time.time()
    _trace(spec, event="start", call=calls, pid=os.getpid(), time=started)
    gate = spec.overrides.get("gate")
    while gate and not Path(gate).exists():
        time.sleep(0.05)
    if calls <= spec.overrides.get("fail_tries", 0):
        raise RuntimeError(f"{spec.label} fails on purpose (call {calls})")
    if calls <= spec.overrides.get("interrupt_tries", 0):
        # as Lightning's import leaves a deprecation warning at the end of a dead job's log
        atexit.register(print, "UserWarning: LeafSpec is deprecated (a warning, not the cause)", file=sys.stderr)
        raise KeyboardInterrupt
    status = "error" if calls <= spec.overrides.get("error_tries", 0) else "ok"
    ended = time.time()
    _trace(spec, event="end", call=calls, pid=os.getpid(), time=ended)
    return RunResult(
        spec=spec,
        status=status,
        error="ValueError: the run recorded an error" if status == "error" else None,
        steps_done=spec.steps,
        train_loss=expected_loss(spec),
        stability={"threads": torch.get_num_threads(), "calls": calls, "started": started, "ended": ended},
    )


def stepped_run(spec: RunSpec) -> RunResult:
    """A run of ``spec.steps`` steps that saves its progress after every step, resumes from it, and stops
    (``RunPreempted``) at the end of a step once preemption is requested: the shape of a checkpointable run."""
    folder = Path(spec.overrides["dir"])
    progress = folder / f"{spec.label}.progress.json"
    fresh = {"step": 0, "loss": float(spec.seed), "starts": []}
    state = json.loads(progress.read_text()) if progress.exists() else fresh
    state["starts"].append(state["step"])
    hold_at = spec.overrides.get("hold_at_step") if len(state["starts"]) == 1 else None
    for step in range(state["step"], spec.steps):
        state["step"], state["loss"] = step + 1, state["loss"] + (step + 1) * spec.lr
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(progress)
        deadline = time.monotonic() + 300  # a bound against a signal that never comes: the run then goes on
        while step + 1 == hold_at and not preemption_requested() and time.monotonic() < deadline:
            time.sleep(0.02)
        if preemption_requested():
            raise RunPreempted
    starts = {"starts": state["starts"]}
    return RunResult(spec=spec, steps_done=state["step"], train_loss=state["loss"], stability=starts)
