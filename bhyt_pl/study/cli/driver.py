"""The one driver every kind of study runs on: ``python -m bhyt_pl study [KIND] ...``.

A kind (``bhyt_pl.study.cli.kinds``) brings its options, its plan and its document; the driver owns the rest, the
same for every kind: ``--config`` files, ``--report-from`` (for any record, whatever kind wrote it), ``--dry-run``,
the launcher and the ``Scheduler`` (finished runs in ``--out`` are reused unless ``--restart``), the record and
the document rewritten after every run, and Ctrl-C: exit 130, with the line that resumes it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

import torch

from bhyt_pl.study.cli.config_file import expand_config_files
from bhyt_pl.study.cli.kinds import KINDS, PreparedStudy, StudyKind, kind_for_command, study_parser
from bhyt_pl.study.cli.setup import loadavg_text
from bhyt_pl.study.launch.options import (
    LaunchOptions,
    check_launcher,
    interrupted_runs,
    make_launcher,
    study_folder,
)
from bhyt_pl.study.launch.scheduler import Scheduler, progress_line
from bhyt_pl.study.protocol.spec import RunResult, RunStatus, TrainerSettings
from bhyt_pl.study.record.invocation import Invocation
from bhyt_pl.study.record.results import load, save

__all__ = ["main", "report_from"]

log = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 10.0
"""At most this often, a line saying how many runs are queued and running while none finishes."""


def report_from(folder: Path, figures: bool = True) -> dict[str, Path]:
    """The document and (``figures``) the figures of the study in ``folder``, rebuilt from its ``results.json``
    alone (read, not written) by the kind that wrote it."""
    try:
        record = load(folder)
    except ValueError as exc:
        raise ValueError(f"--report-from {str(folder)!r}: {exc}") from exc
    if record.kind not in KINDS:
        raise ValueError(f"--report-from {str(folder)!r}: a record of kind {record.kind!r}; the kinds: {sorted(KINDS)}")
    return KINDS[record.kind].render(Path(folder), record, figures=figures)


def _load_builtin_kinds() -> None:
    """The exploration, the confirmation and the token-budget map register themselves when imported."""
    from bhyt_pl.study.cli import confirmation, exploration, token_budget  # noqa: F401


def main(argv: Sequence[str] | None = None) -> int:
    """Run a study; 0 when every run finished or diverged (a result), 1 when a run failed with an error, 2 on bad
    arguments (one message, before any work), 130 when interrupted."""
    _load_builtin_kinds()
    try:
        kind, rest = kind_for_command(list(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    p = study_parser(kind)
    try:
        args = p.parse_args(expand_config_files(p, rest))
    except SystemExit as exc:  # argparse already printed the message
        return int(exc.code or 0)
    except ValueError as exc:  # a --config file that cannot be read or names no option
        print(f"error: {exc}", file=sys.stderr)
        return 2
    values: dict[str, object] = dict(vars(args))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.report_from is not None:
            paths = report_from(args.report_from)
            log.info("report rebuilt from %s: %s", Path(args.report_from) / "results.json", paths["report"])
            return 0
        prepared = kind.prepare(values, rest)
        if prepared.stop is not None:
            return prepared.stop
        launch = LaunchOptions.from_values({**values, "accelerator": _settings(prepared).accelerator})
        workers = check_launcher(launch)  # bad workers, devices or cluster settings: before any run
        if args.dry_run:
            if prepared.dry_run is None:
                raise ValueError(f"--dry-run: the {kind.name} has no dry run")
            return prepared.dry_run(workers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run(kind, prepared, values, launch, workers)


def _settings(prepared: PreparedStudy) -> TrainerSettings:
    assert prepared.record.setup is not None, "a kind that trains records its setup"
    return prepared.record.setup.settings


def _run(
    kind: StudyKind, prepared: PreparedStudy, values: Mapping[str, object], launch: LaunchOptions, workers: int
) -> int:
    """Train ``prepared``'s runs through the launcher, the record and the document after each."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from bhyt_pl.study.run.runner import run_one

    if values.get("threads") is not None:
        torch.set_num_threads(int(values["threads"]))
    record, setup, noun = prepared.record, prepared.record.setup, prepared.noun
    assert setup is not None
    out = study_folder(launch, prepared.out)
    meta = record.meta
    meta["workers"] = workers
    restart = bool(values.get("restart"))
    invocation = Invocation.resume(out, restart=restart)  # the wall time of earlier invocations carries over
    started = time.perf_counter()
    batches = setup.validation_batches(prepared.base_data_seed)
    if prepared.on_start is not None:
        prepared.on_start(batches)
    run = partial(run_one, datamodule_factory=setup.data, val_batches=batches, settings=setup.settings, out_dir=out)
    try:
        launcher = make_launcher(launch, run, out, workers)
    except ValueError as exc:  # another driver holds the study folder; SLURM's tools missing
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = record.runs
    shown: dict[str, object] = {"counts": None, "at": started}

    def on_change(counts: dict[str, int]) -> None:
        # a cluster's runs queue and start long before one finishes: show how many are queued and running when that
        # changes, at most every 10 s (results are shown as they are handed back, by on_result)
        now, waiting = time.perf_counter(), (counts["queued"], counts["running"])
        if waiting != shown["counts"] and waiting != (0, 0) and now - float(shown["at"]) >= _PROGRESS_EVERY_S:
            shown.update(counts=waiting, at=now)
            done, submitted = len(results), scheduler.submitted
            log.info(progress_line(done, submitted, now - started, len(scheduler.reused), prepared.final(), counts))

    scheduler = Scheduler(launcher, out, resume=not restart, on_change=on_change)

    def on_result(result: RunResult) -> None:
        results.append(result)
        counts = scheduler.counts()
        shown.update(counts=(counts["queued"], counts["running"]), at=time.perf_counter())
        elapsed = time.perf_counter() - started
        log.info(progress_line(len(results), scheduler.submitted, elapsed, len(scheduler.reused), prepared.final(),
                               counts))  # fmt: skip
        log.info(
            "  %s: %s, train loss %.4f, val loss %.4f, %.0f s",
            result.spec.label,
            result.status,
            result.train_loss,
            result.val_loss,
            result.wall_seconds,
        )
        # the record after every run says it is partial (k of N runs): an interrupted study keeps what it measured
        invocation.record(meta, len(results), scheduler.submitted, prepared.final())
        if rank_zero_only.rank == 0:  # the tables after every run, the figures at the end
            save(out, record, kind.sections(record))
            kind.render(out, record, figures=False)

    finished, paths = False, None
    try:
        results[:] = prepared.execute(scheduler, on_result)
        finished = True
    except KeyboardInterrupt:
        pass  # reported below, after the partial report is written
    finally:  # figures once, at the end or on an interrupt, for the runs that finished
        launcher.close()
        final = prepared.final()
        invocation.record(meta, len(results), scheduler.submitted, final, "finished" if finished else "interrupted")
        meta["runs_reused"] = len(scheduler.reused)
        meta["loadavg_at_end"] = loadavg_text()
        # not after a stop before the first result: that would replace a previous invocation's record with an
        # empty one (its runs are still in runs/ and are read back next time)
        if rank_zero_only.rank == 0 and (results or (finished and not scheduler.submitted)):
            save(out, record, kind.sections(record))
            paths = kind.render(out, record)
    if not finished:
        where = interrupted_runs(launch.launcher)
        planned = f"{'' if final else 'at least '}{scheduler.submitted}"
        kept = f"partial report: {paths['report']}" if paths else "nothing finished, no report written"
        log.warning("%s interrupted after %.0f s, %d of %s runs done; %s", noun, invocation.seconds, len(results),
                    planned, kept)  # fmt: skip
        log.warning("%s; the same command resumes it, reusing every finished run", where)
        return 130
    if paths is not None:
        invocations = len(meta["invocations"])
        total = f" ({meta['wall_seconds']:.0f} s over {invocations} invocations)" if invocations > 1 else ""
        log.info("%s finished in %.0f s%s; report: %s", noun, invocation.seconds, total, paths["report"])
    failed = [r.spec.label for r in results if r.status == RunStatus.ERROR]
    if failed:
        log.error("%s: %d run(s) failed (listed in the report): %s", noun, len(failed), ", ".join(failed))
    return 1 if failed else 0
