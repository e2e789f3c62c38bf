"""``python -m bhyt_pl``: LightningCLI for fit/validate/test/predict, plus the package's own tools.

The LightningCLI subclass adds defaults, argument links and the checks that keep a run's work safe:
- ``model.seq_len`` and ``model.tokenizer`` come from the instantiated data module;
- a run writes to ``<runs_dir>/<run_name>/version_N/`` (``run_name`` defaults to ``<preset>-<norm>``, plus a
  short hash when overrides or norm arguments change the model: ``default_run_name``):
  TensorBoard log, ``config.yaml`` and ``checkpoints/`` (``last.ckpt`` at the final step, on SIGTERM
  and on Ctrl-C); ``version_N`` is claimed atomically (``bhyt_pl.runs``);
- ``--ckpt_path last`` is the newest version's last checkpoint under ``<runs_dir>/<run_name>/``
  (or the older ``<run_name>/checkpoints/`` layout), an error when there is none; a resume writes
  into the version folder of the checkpoint it continues, and fails before any work when the model
  config differs from the checkpoint's (``bhyt_pl.checkpoint.resume_mismatches``);
- ``RunCheckpoint`` (``--checkpoint.*``), ``HangWatchdog`` (``--hang_watchdog.*``: SIGTERM or Ctrl-C ends a
  run hung in a collective), ``LearningRateMonitor`` (``--lr_monitor.*``) and the step progress bar are always
  on, and ``TokenThroughputMonitor`` (tokens/s in the progress bar) unless the config already has one; a
  monitor configured twice (a callback preset stacked on a recipe that has one) is kept once, the later one
  (``ONE_PER_RUN``);
- ``validate``/``test``/``predict`` on a run's checkpoint log into that run's version folder (their config as
  ``config_<subcommand>.yaml``) instead of claiming a new ``version_N`` at every call;
- the fit's log line of optimisation settings names the recipe file or the command line each given one came from;
- single-file checkpoints are written atomically (``AtomicCheckpointIO``) unless ``trainer.plugins`` is set;
  sharded ones by ``RunCheckpoint``; Ctrl-C finishes the step and saves (``--checkpoint.save_on_ctrl_c``);
- every run writes ``<version dir>/train.log`` (``RunLogFile``: logging, warnings, the traceback);
- on the command line, problems the user fixes (bad settings, files, a full disk, an incomplete checkpoint, a
  missing extra: ``bhyt_pl.optional``) print one short error without a traceback and exit with status 2 (once,
  from rank 0, when every rank raises it: ``AgreedUsageError``); a stopped peer process or a failed save
  prints one line naming the last complete checkpoint and the command that resumes, and exits with status 1
  (``bhyt_pl.failures``); an error every rank raises (a full disk at a save, too little free space) prints once.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning
from jsonargparse import ActionConfigFile, Namespace
from lightning.pytorch import LightningDataModule
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only

from bhyt_pl.callbacks.checkpointing import CheckpointSaveError, RunCheckpoint, StoppedByCtrlC
from bhyt_pl.checkpoint_io import human_size
from bhyt_pl.disk_full import DiskFull, disk_full_in, free_bytes
from bhyt_pl.errors import AgreedUsageError, UsageError, exception_chain
from bhyt_pl.failures import FailureReport, python_command
from bhyt_pl.module import GIVEN, LlamaLM
from bhyt_pl.optional import MissingExtra
from bhyt_pl.run_config import data_run_facts, data_tokenizer
from bhyt_pl.runs import run_loggers
from bhyt_pl.watchdog import HangWatchdog

__all__ = ["BHyTCLI", "default_run_name", "main"]

TOOLS = {
    "eval": "bhyt_pl.eval",
    "bench": "bhyt_pl.bench",
    "study": "bhyt_pl.study",
    "consolidate": "bhyt_pl.checkpoint_io",
    "export": "bhyt_pl.convert",
    "compare": "bhyt_pl.compare",
}
"""Subcommands that are not Lightning's: each module exposes ``main(argv) -> int``."""

ONE_PER_RUN = ("DepthStatsMonitor", "StabilityMonitor", "TokenThroughputMonitor")
"""Monitors a run has at most one of: two would log the same tags twice. A callback preset stacked on a recipe
that already configures one (``recipes/tiny.yaml`` has a ``DepthStatsMonitor``) replaces it."""


def _data_seq_len(data: Any) -> int | None:
    """The training sequence length the data module declares among its run facts (``RunFactsSource``)."""
    return data_run_facts(data).get("seq_len")


def _norm_label(norm: Any) -> str:
    if isinstance(norm, str):
        return norm
    class_path = getattr(norm, "class_path", None) or (norm.get("class_path") if isinstance(norm, dict) else None)
    return str(class_path).rsplit(".", 1)[-1].lower() if class_path else "custom"


def _model_settings(config: Any) -> dict[str, Any]:
    """The resolved model config without the norm's run facts (``seq_len`` is the data's, not a model choice)."""
    from bhyt_pl.checkpoint import resolved_model_config

    resolved = resolved_model_config(config)
    for fact in config.norm_scheme().run_facts:
        resolved["norm_args"].pop(fact, None)
    return resolved


def default_run_name(
    preset: str, norm: Any, overrides: dict[str, Any] | None = None, norm_args: dict[str, Any] | None = None
) -> str:
    """``<preset>-<norm>``, plus ``-<8 hex digits>`` hashing every model setting that differs from the preset
    with that norm's defaults (``--model.overrides`` such as ``qk_norm`` or ``n_layers``, ``--model.norm_args``).

    Two runs share a default name only when they build the same model, so ``--ckpt_path last`` never picks
    up another architecture's checkpoint; settings are compared resolved, so spelling out a default (a norm
    overlay listing its arguments) or an alias keeps the name. ``--run_name`` replaces it.

    Example:
        >>> default_run_name("tiny", "bhyt"), default_run_name("tiny", "bhyt", norm_args={"lambda_attn": 2.0})
        ('tiny-bhyt', 'tiny-bhyt')
        >>> default_run_name("tiny", "derf", {"qk_norm": True})  # doctest: +ELLIPSIS
        'tiny-derf-...'
    """
    import hashlib
    import json

    from bhyt_pl.config import LlamaConfig

    label = f"{preset}-{_norm_label(norm)}"
    if not overrides and not norm_args:
        return label
    try:
        base = _model_settings(LlamaConfig.from_name(preset, norm=norm))
        ours = _model_settings(LlamaConfig.from_name(preset, **dict(overrides or {}), norm=norm,
                                                     norm_args=dict(norm_args or {})))  # fmt: skip
    except (ValueError, TypeError):  # a bad setting: the run fails before any work, naming it (the constructors)
        return label
    changed = {key: value for key, value in ours.items() if value != base.get(key)}
    if not changed:
        return label
    digest = hashlib.sha1(json.dumps(changed, sort_keys=True, default=repr).encode()).hexdigest()[:8]
    return f"{label}-{digest}"


def _one_line(message: str) -> str:
    """jsonargparse's message as one line: a bad ``--data.init_args.*`` value comes wrapped in a dump of the
    union's subtypes and the whole namespace; keep the data module's own errors, which name the field."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    key = re.fullmatch(r'Parser key "(.+)":', lines[0]) if lines else None
    given = next((line.removeprefix("Given value: ") for line in lines if line.startswith("Given value: ")), None)
    if key:
        lines = lines[1:]
    if "Errors:" in lines:
        errors = []
        for line in lines[lines.index("Errors:") + 1 :]:
            if line.startswith("Given value") or line.startswith("- Expected a <class 'NoneType'>"):
                break
            errors.append(line.removeprefix("- "))
        lines = errors or lines
        if given is not None and len(given) <= 60:
            lines.append(f"(got {given})")
    return (f"--{key.group(1)}: " if key else "") + " ".join(lines)


class _ShortErrorParser(LightningArgumentParser):
    """Parse errors as one line: ``error: <what> (options: python -m bhyt_pl fit --help)``, exit status 2,
    without the usage dump (about 80 lines for ``fit``) and with the command the user types (jsonargparse
    names the script, ``__main__.py``)."""

    def print_usage(self, file: Any = None) -> None:
        pass

    def error(self, message: str, ex: Exception | None = None) -> Any:
        from jsonargparse._common import debug_mode_active

        if not self.exit_on_error or debug_mode_active():
            return super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        words = parser.prog.replace(" [options]", "").split()
        command = " ".join([python_command(), "-m bhyt_pl", *words[1:]])
        sys.stderr.write(f"error: {_one_line(message)}{_did_you_mean(message, parser)} (options: {command} --help)\n")
        raise SystemExit(2)


def _did_you_mean(message: str, parser: Any) -> str:
    """``; did you mean --trainer.max_steps?`` for an unrecognized option close to one the parser (or, for
    ``fit`` and the other subcommands, their parser) takes; "" when none is close. Options are never abbreviated
    (``allow_abbrev=False``), so a typo is an error rather than silently read as the option it starts."""
    import difflib

    found = re.search(r"unrecognized arguments: (--[^\s=]+)", message, re.IGNORECASE)
    if found is None:
        return ""
    options = set(parser._option_string_actions)
    for sub in parser._subcommands_action.choices.values() if parser._subcommands_action else ():
        options |= set(sub._option_string_actions)
    close = difflib.get_close_matches(found.group(1), sorted(options), n=1, cutoff=0.8)
    return f"; did you mean {close[0]}?" if close else ""


def _model_setting_sources(argv: list[str], keys: Any) -> dict[str, str]:
    """Where the command line ``argv`` set each ``model.<key>``: the last ``--config`` file whose ``model`` section
    sets it, or ``command line`` for ``--model.<key>``; keys nobody set are absent. Later arguments win, as they do
    for the parser."""
    import yaml

    sources: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            key = arg.removeprefix("--model.").split("=", 1)[0]
            if arg.startswith("--model.") and key in keys:
                sources[key] = "command line"
            continue
        try:
            model = (yaml.safe_load(Path(path).read_text()) or {}).get("model") or {}
        except (OSError, yaml.YAMLError, AttributeError):  # not a readable mapping: the parser reports it
            continue
        for key in keys:
            if isinstance(model, dict) and model.get(key) is not None:
                sources[key] = path
    return sources


class BHyTCLI(LightningCLI):
    """LightningCLI with bhyt_pl's defaults, links, run layout and resume checks.

    ``failure_report`` (``main`` passes its own) learns the trainer, to report a failed run in one line."""

    def __init__(self, *args: Any, failure_report: FailureReport | None = None, **kwargs: Any) -> None:
        self.failure_report = failure_report if failure_report is not None else FailureReport(sys.argv[1:])
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # the command line as given, to name the file or flag behind each setting (``after_instantiate_classes``);
        # a dict or Namespace of arguments has no order to read it from
        self._argv = list(args) if isinstance(args, (list, tuple)) else sys.argv[1:] if args is None else []
        super().parse_arguments(parser, args)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={lightning.__version__}"])
        # no prefix matching: `--trainer.max_step 10` is an unknown option, not `--trainer.max_steps 10` read silently
        # (LightningCLI builds the main parser and each subcommand's through this method)
        kwargs.setdefault("allow_abbrev", False)
        parser = _ShortErrorParser(**kwargs)
        parser.add_argument(
            "-c", "--config", action=ActionConfigFile, help="Path to a configuration file in json or yaml format."
        )
        return parser

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - jsonargparse parser
        parser.add_argument("--runs_dir", type=str, default="runs", help="Root directory of logs and checkpoints.")
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="Run directory name; default '<preset>-<norm>', plus '-<hash>' when the model is not the preset's.",
        )
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        # one file, ``last.ckpt``, unless the user asks for top-k (``--checkpoint.save_top_k K --checkpoint.monitor
        # val/loss``) or periodic copies (``--checkpoint.save_top_k -1``): Lightning's default top-1 writes a second
        # full ``epoch=E-step=N.ckpt`` beside it, which doubles the disk use and goes stale after a resume
        parser.set_defaults(
            {"checkpoint.save_last": True, "checkpoint.every_n_train_steps": 1000, "checkpoint.save_top_k": 0,
             "checkpoint.save_on_ctrl_c": True}
        )  # fmt: skip
        parser.add_lightning_class_args(HangWatchdog, "hang_watchdog")  # a signal ends a run hung in a collective
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "step"})
        # the data module's declared run facts (docs/method.md, section 9): every one to the model, which
        # builds its config with ``build_run_config``; seq_len also on its own, as LlamaLM records it
        parser.link_arguments("data", "model.seq_len", compute_fn=_data_seq_len, apply_on="instantiate")
        parser.link_arguments("data", "model.run_facts", compute_fn=data_run_facts, apply_on="instantiate")
        parser.link_arguments("data", "model.tokenizer", compute_fn=data_tokenizer, apply_on="instantiate")

    def _subcommand_config(self) -> Namespace:
        subcommand = self.config.get("subcommand")
        return self.config[subcommand] if subcommand else self.config

    @staticmethod
    def _run_dir(cfg: Namespace) -> Path:
        model = cfg.model
        run_name = cfg.run_name or default_run_name(model.preset, model.norm, model.overrides, model.norm_args)
        return Path(cfg.runs_dir) / run_name

    def _parse_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path last`` with the package's own lookup and check the file is a checkpoint.

        Replaces LightningCLI's version, which silently overwrites ``--model.*`` with the checkpoint's
        hyperparameters (so ``--model.norm``, ``--model.preset`` and ``--model.lr`` had no effect); a
        differing config is an error instead (``before_fit``)."""
        if not self.config.get("subcommand"):
            return
        cfg = self._subcommand_config()
        ckpt_path = cfg.get("ckpt_path")
        if ckpt_path is None and self.config.subcommand == "fit" and _slurm_restarts() > 0:
            from bhyt_pl.runs import find_last_checkpoint

            found = find_last_checkpoint(self._run_dir(cfg))
            if found is not None:  # a requeued SLURM job repeats its command: it continues its run
                _say(f"bhyt_pl: requeued SLURM job (restart {_slurm_restarts()}): resuming from {found}")
                ckpt_path = cfg.ckpt_path = str(found)
        if ckpt_path == "last":
            from bhyt_pl.runs import find_last_checkpoint, last_checkpoint_candidates

            run_dir = self._run_dir(cfg)
            found = find_last_checkpoint(run_dir)
            if found is None:
                looked = ", ".join(str(p) for p in last_checkpoint_candidates(run_dir))
                raise UsageError(
                    f"--ckpt_path last: nothing to resume under {str(run_dir)!r} (looked in {looked}); "
                    f"the run folder is <runs_dir>/<run_name> with run_name defaulting to <preset>-<norm>, plus a hash "
                    f"of model overrides: check --runs_dir, --run_name, --model.norm and --model.overrides, or drop "
                    f"--ckpt_path to start a new run"
                )
            cfg.ckpt_path = str(found)
        elif ckpt_path in (None, "best", "hpc") or str(ckpt_path).startswith("registry"):
            return
        from bhyt_pl.checkpoint import read_checkpoint_metadata

        self._checkpoint_meta = read_checkpoint_metadata(cfg.ckpt_path)

    def before_instantiate_classes(self) -> None:
        cfg = self._subcommand_config()
        run_dir = self._run_dir(cfg)
        if cfg.trainer.logger is not False:
            logger_args: dict[str, Any] = {"save_dir": cfg.runs_dir, "name": run_dir.name}
            resumed = _resumed_run_version(cfg.get("ckpt_path"))
            if resumed is not None:  # a resume continues its version folder: one run, one TensorBoard curve
                runs_dir, name, version = resumed
                if runs_dir == Path(cfg.runs_dir).absolute():
                    runs_dir = Path(cfg.runs_dir)  # paths printed as for the fresh run (relative stays relative)
                logger_args = {"save_dir": str(runs_dir), "name": name, "version": version}
                if self.subcommand not in (None, "fit"):  # validate/test/predict: the run's config.yaml stays
                    self.save_config_kwargs = {**self.save_config_kwargs,
                                               "config_filename": f"config_{self.subcommand}.yaml"}  # fmt: skip
            run_logger = {"class_path": "bhyt_pl.runs.RunLogger", "init_args": logger_args}
            if cfg.trainer.logger is None or cfg.trainer.logger is True:
                cfg.trainer.logger = run_logger
            else:  # a recipe's own loggers (recipes/loggers/*.yaml), beside the run folder's TensorBoard log
                cfg.trainer.logger = run_loggers(cfg.trainer.logger, run_logger, cfg.runs_dir, run_dir.name)
        if cfg.checkpoint.dirpath is None and cfg.trainer.logger is False:
            cfg.checkpoint.dirpath = str(run_dir / "checkpoints")  # no version folders without a logger
        callbacks = _one_per_run(list(cfg.trainer.callbacks or []))
        if not any(str(getattr(cb, "class_path", "")).endswith("TokenThroughputMonitor") for cb in callbacks):
            # tokens/s in the progress bar by default; a preset (callbacks/throughput.yaml) configures it
            callbacks.append(Namespace(class_path="bhyt_pl.callbacks.TokenThroughputMonitor", init_args=Namespace()))
        summaries = ("ModelSummary", "RichModelSummary", "RunModelSummary")
        has_summary = any(str(getattr(cb, "class_path", "")).rsplit(".", 1)[-1] in summaries for cb in callbacks)
        if cfg.trainer.enable_model_summary is not False and not has_summary:  # training FLOPs, not 0
            callbacks.append(Namespace(class_path="bhyt_pl.callbacks.summary.RunModelSummary", init_args=Namespace()))
        progress_bars = ("ProgressBar", "TQDMProgressBar", "RichProgressBar", "StepProgressBar")
        has_bar = any(str(getattr(cb, "class_path", "")).rsplit(".", 1)[-1] in progress_bars for cb in callbacks)
        if cfg.trainer.enable_progress_bar is not False and not has_bar:
            callbacks.append(Namespace(class_path="bhyt_pl.callbacks.StepProgressBar", init_args=Namespace()))
        if not any(str(getattr(cb, "class_path", "")).endswith("RunLogFile") for cb in callbacks):
            callbacks.append(Namespace(class_path="bhyt_pl.callbacks.run_log.RunLogFile", init_args=Namespace()))
        cfg.trainer.callbacks = callbacks
        if not cfg.trainer.plugins:  # a kill during a save never leaves a truncated last.ckpt
            cfg.trainer.plugins = [{"class_path": "bhyt_pl.checkpoint_io.AtomicCheckpointIO"}]

    def instantiate_classes(self) -> None:
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        try:
            super().instantiate_classes()
        except (ValueError, TypeError, MisconfigurationException) as err:  # a bad setting found by a constructor
            raise UsageError(_one_line(str(err))) from err  # the message names it (Trainer's: `max_steps` must be ...)

    def after_instantiate_classes(self) -> None:
        """Name the recipe file or the command line behind each optimisation setting the fit's log line lists."""
        super().after_instantiate_classes()
        model = getattr(self, "model", None)  # absent when a subclass parses without building (tests, tools)
        if isinstance(model, LlamaLM):
            sources = model.training_sources
            found = _model_setting_sources(getattr(self, "_argv", []), [k for k, v in sources.items() if v == GIVEN])
            sources.update(found)

    def _check_checkpoint_config(self) -> None:
        """Fail before any work when the model config differs from the checkpoint's (resume or evaluation)."""
        meta = getattr(self, "_checkpoint_meta", None)
        if meta is None or not isinstance(self.model, LlamaLM):
            return
        from bhyt_pl.checkpoint import resume_mismatches

        problems = resume_mismatches(self.model.config, self.model.hparams, meta)
        if problems:
            path = self._subcommand_config().ckpt_path
            raise UsageError(
                f"the configuration differs from the checkpoint {path}:\n  - " + "\n  - ".join(problems) + "\n"
                f"Repeat the checkpoint's settings (its run's config.yaml holds them), or start a new run from its "
                f"weights with --model.init_checkpoint {path} (without --ckpt_path)"
            )

    before_fit = before_validate = before_test = before_predict = _check_checkpoint_config

    def _run_subcommand(self, subcommand: str) -> None:
        """Resuming a run that already reached ``max_steps`` trains nothing: say so in one line instead.

        Such a run is complete, its final validation included: ``RunCheckpoint`` saves a step that is followed by
        a validation (the last step is, ``ValidateAtLastStep``) once that validation has ended, so a run stopped
        before or during its final validation was saved at an earlier step and resumes from there."""
        meta = getattr(self, "_checkpoint_meta", None)
        max_steps = self.trainer.max_steps
        if subcommand == "fit" and meta is not None and max_steps is not None and max_steps >= 0:
            step = meta.get("global_step", 0)
            if step >= max_steps:
                self._check_checkpoint_config()
                _say(
                    f"bhyt_pl: the run is complete at step {step} (max_steps {max_steps}); nothing to train. "
                    f"To train longer, resume with a larger --trainer.max_steps"
                )
                return
        self.failure_report.trainer = self.trainer
        for callback in self.trainer.callbacks:
            if isinstance(callback, HangWatchdog):  # its line names the command that resumes
                callback.failure_report = self.failure_report
        with self.failure_report.watching_launched_processes():
            super()._run_subcommand(subcommand)


def _class_name(callback: Any) -> str:
    """The class name of a callback as parsed (``class_path``/``init_args``), or "" for anything else."""
    path = callback.get("class_path") if isinstance(callback, dict) else getattr(callback, "class_path", None)
    return str(path or "").rsplit(".", 1)[-1]


def _one_per_run(callbacks: list[Any]) -> list[Any]:
    """``callbacks`` (as parsed) with each ``ONE_PER_RUN`` class kept once: its last configuration, where it stands."""
    last = {_class_name(cb): i for i, cb in enumerate(callbacks) if _class_name(cb) in ONE_PER_RUN}
    return [cb for i, cb in enumerate(callbacks) if last.get(_class_name(cb), i) == i]


@rank_zero_only
def _say(message: str) -> None:
    """One line on stdout from rank 0 only: every rank of a multi-process job runs the CLI."""
    print(message)


def _slurm_restarts() -> int:
    """How many times SLURM has requeued this job (0 outside SLURM)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def _resumed_run_version(ckpt_path: str | None) -> tuple[Path, str, int] | None:
    if not ckpt_path:
        return None
    from bhyt_pl.runs import checkpoint_run_version

    return checkpoint_run_version(ckpt_path)


def _check_yaml_files(argv: list[str]) -> None:
    """A YAML syntax error names its file (jsonargparse reports only ``<unicode string>``, which is
    ambiguous with several stacked ``--config`` files)."""
    import yaml

    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            path = Path(argv[i + 1])
        elif arg.startswith("--config="):
            path = Path(arg.split("=", 1)[1])
        else:
            continue
        if not path.is_file():
            continue
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise UsageError(f"YAML syntax error in {str(path)!r}: {err}") from None


def _disk_full_message(full: OSError, save: CheckpointSaveError | None) -> str:
    """``No space left on device`` (or ``Disk quota exceeded``), what was being written, the free space (when the
    save failed, for a ``DiskFull``; else now) and about how much a checkpoint needs, and what to do."""
    reason = full.strerror or os.strerror(full.errno or 0)
    target = save.target if save is not None else full.filename
    path = Path(target) if target else None
    if isinstance(full, DiskFull) and full.free is not None:
        sizes = [f"{human_size(full.free)} was free when the save failed"]
    elif path is not None and (free := free_bytes(path.parent)) is not None:
        sizes = [f"{human_size(free)} is free in {path.parent}"]
    else:
        sizes = []
    if getattr(full, "needed", None) is not None:
        sizes.append(f"a checkpoint needs about {human_size(full.needed)}")
    room = f" ({'; '.join(sizes)})" if sizes else ""
    fix = "Free space, or write the run elsewhere with --runs_dir"
    if save is not None:
        return f"{reason} while saving {save.target} at step {save.step}{room}. {fix}; {save.kept}"
    if path is None:
        return f"{reason}. {fix}"
    if path.exists():
        kept = f"; the previous {path.name} is intact (checkpoints are written atomically)"
    else:
        kept = f"; no {path.name} was written"
    return f"{reason} while writing {path}{room}. {fix}{kept}"


def user_error_message(err: BaseException) -> str | None:
    """The short message the command line prints for an error the user fixes, None for any other
    (which keeps its traceback)."""
    full = disk_full_in(err)
    if full is not None:
        save = next((exc for exc in exception_chain(err) if isinstance(exc, CheckpointSaveError)), None)
        return _disk_full_message(full, save)
    if isinstance(err, (UsageError, MissingExtra, FileNotFoundError, PermissionError)):
        return str(err)
    return None


def main(
    args: list[str] | None = None, run: bool = True, handle_errors: bool | None = None, **kwargs: Any
) -> BHyTCLI | int | None:
    """Entry point. ``args`` defaults to ``sys.argv[1:]``; tools (``eval``, ``bench``, ...) return an exit code.

    ``handle_errors`` (default: when reading ``sys.argv``, i.e. on the command line) prints a problem the
    user fixes as one ``error: ...`` line without a traceback and exits with status 2; from Python the
    exception propagates (a ``UsageError`` is a ``ValueError``)."""
    argv = list(sys.argv[1:] if args is None else args)
    if handle_errors is None:
        handle_errors = args is None
    report = FailureReport(argv)
    try:
        if argv and argv[0] in TOOLS:
            import importlib

            tool: Callable[[list[str]], int] = importlib.import_module(TOOLS[argv[0]]).main
            return tool(argv[1:])
        _check_yaml_files(argv)
        return BHyTCLI(
            LlamaLM,
            LightningDataModule,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            args=argv if (args is not None or not run) else None,
            run=run,
            failure_report=report,
            **kwargs,
        )
    except StoppedByCtrlC:
        if not handle_errors:
            raise
        raise SystemExit(130) from None  # 128 + SIGINT, as a shell reports a Ctrl-C; the run printed its line
    except Exception as err:
        if not handle_errors:
            raise
        report.console_ready()  # the error starts a line of its own, not the end of the progress bar's
        message = user_error_message(err)
        if message is not None:
            agreed = any(isinstance(exc, (AgreedUsageError, CheckpointSaveError)) for exc in exception_chain(err))
            if not agreed or rank_zero_only.rank == 0:  # every rank raised an agreed one: it is printed once
                report.print_line(message)  # on stderr and at the end of train.log
            raise SystemExit(2) from None
        report.report_and_exit(err)  # a dead peer, a failed save: one line; else the traceback and train.log
        raise
