"""``python -m bhyt_pl compare RUN ...``: several runs side by side in one figure and one table.

A RUN is a run version folder (``runs/tiny-bhyt/version_0``, its TensorBoard event files), a run folder
(``runs/tiny-bhyt``: its newest version), or a depth study's ``results.json`` (or its folder), whose runs
``--only`` filters by label. The figure (``--out``, PNG) has these panels:

- train and val loss against training tokens (``config.yaml``'s global batch x sequence length x steps;
  steps where a run has no ``config.yaml``);
- the last logged depth profile of every per-layer statistic ``DepthStatsMonitor`` logs by default that has a
  last-layer summary (``bhyt_pl.callbacks.layer_stats``: ``depth/magnitude`` and ``depth/variance``) against layer;
- the last stability profile: ``stability/grad_norm`` and ``stability/attn_entropy`` against layer.

Beside it (same name, ``.md``) a markdown table of each run's final values: last logged step, tokens, train and val
loss, the last layer's value of each of those statistics, loss and gradient-norm spike counts; the table is printed
too. Steps are optimizer steps, as ``max_steps`` counts them: a 40-step run's last is 40 in the table, the legends
and the token counts alike.
Runs are labelled by their norm and norm arguments (``hparams.yaml``). Runs of different lengths and runs
still in progress (event files being written) are read as they are: each curve ends where its run is.

Example:
    python -m bhyt_pl compare runs/tiny-rmsnorm runs/tiny-bhyt --out compare.png
"""

from __future__ import annotations

import argparse
import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bhyt_pl.callbacks.layer_metrics import layer_series, split_layer_key
from bhyt_pl.callbacks.layer_stats import LayerStatistic, OnBlockOutput, statistics
from bhyt_pl.errors import UsageError

__all__ = [
    "STABILITY_PROFILES",
    "RunData",
    "compare",
    "depth_statistics",
    "load_event_run",
    "load_runs",
    "load_study_runs",
    "main",
    "markdown_table",
    "profiles",
]

STABILITY_PROFILES = (
    ("stability/grad_norm", "block gradient norm", True),
    ("stability/attn_entropy", "attention entropy (nats)", False),
)
"""StabilityMonitor's per-layer statistics drawn against depth: ``(tag, y label, log scale)``."""


def depth_statistics() -> tuple[LayerStatistic, ...]:
    """The block statistics compared: logged by ``DepthStatsMonitor`` by default, with a last-layer summary."""
    return tuple(
        s
        for s in statistics()
        if s.monitor and isinstance(s.measure, OnBlockOutput) and any(m.kind == "last" for m in s.summaries)
    )


def profiles() -> list[str]:
    """Per-layer statistics drawn against depth (the last logged profile of each): the depth statistics'
    ``depth/<name>``, then StabilityMonitor's."""
    return [f"depth/{s.name}" for s in depth_statistics()] + [tag for tag, _, _ in STABILITY_PROFILES]


@dataclass
class RunData:
    """One run's curves and profiles, from TensorBoard events or a study's ``results.json``.

    ``train_loss`` and ``val_loss`` are ``(step, value)`` pairs in step order; ``tokens_per_step`` is None
    when unknown (then curves are drawn against steps); ``profiles`` maps a statistic (``depth/magnitude``)
    to ``(step, [value per layer])`` of its last logged step; ``scalars`` holds final values of single
    scalars (``stability/loss_spikes``)."""

    label: str
    source: str
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    val_loss: list[tuple[int, float]] = field(default_factory=list)
    tokens_per_step: int | None = None
    profiles: dict[str, tuple[int, list[float]]] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return max([s for s, _ in self.train_loss] + [s for s, _ in self.val_loss], default=0)

    @property
    def tokens(self) -> int | None:
        return None if self.tokens_per_step is None else self.steps * self.tokens_per_step


# ----------------------------------------------------------------------------- reading
def norm_label(norm: Any, norm_args: Any, run_facts: Mapping[str, Any] | None = None) -> str:
    """``bhyt (lambda_attn=1.0)``: the norm and its arguments, as a run's hparams give them. An argument that is
    a run fact bound to the run's own value (BHyT's ``seq_len``, its T) is left out: it says nothing a reader
    chose."""
    name = norm if isinstance(norm, str) else str(getattr(norm, "get", lambda k: None)("class_path") or norm)
    facts = run_facts or {}
    shown = {k: v for k, v in (norm_args or {}).items() if not (k in facts and v == facts[k])}
    args = ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))
    return f"{name} ({args})" if args else name


def _event_dir(path: Path) -> Path:
    """The folder of a run's event files: ``path`` itself, else its newest ``version_N``."""
    if any(path.glob("events.out.tfevents.*")):
        return path
    versions = [p for p in path.glob("version_*") if p.is_dir() and p.name[8:].isdigit()]
    versions = [p for p in versions if any(p.glob("events.out.tfevents.*"))]
    if not versions:
        raise UsageError(
            f"compare: {str(path)!r} has no TensorBoard event files, no version_N folder with them and no "
            f"results.json; give a run version folder (runs/<run_name>/version_N), a run folder or a study's "
            f"results.json"
        )
    return max(versions, key=lambda p: int(p.name[8:]))


def _tokens_per_step(config_path: Path) -> int | None:
    """Global batch x sequence length from a run's resolved ``config.yaml`` (None when it says too little)."""
    if not config_path.is_file():
        return None
    cfg = yaml.safe_load(config_path.read_text()) or {}
    trainer, data = cfg.get("trainer") or {}, cfg.get("data") or {}
    data_args = data.get("init_args", data) if isinstance(data, dict) else {}
    batch = data_args.get("batch_size")
    seq_len = data_args.get("seq_len") or data_args.get("max_seq_len")
    devices = trainer.get("devices", 1)
    if not isinstance(batch, int) or not isinstance(seq_len, int) or not isinstance(devices, int):
        return None  # "auto" devices or an unknown data module
    return (
        batch
        * seq_len
        * devices
        * int(trainer.get("num_nodes") or 1)
        * int(trainer.get("accumulate_grad_batches") or 1)
    )


def load_event_run(path: str | Path) -> RunData:
    """One run from its TensorBoard event files (all of a version folder's, resumes included)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = _event_dir(Path(path))
    hparams_path = folder / "hparams.yaml"
    hparams = {}
    if hparams_path.is_file():  # read as Lightning writes it: a plain Trainer's LlamaLM has tuples (betas)
        from lightning.pytorch.core.saving import load_hparams_from_yaml

        hparams = load_hparams_from_yaml(hparams_path, use_omegaconf=False) or {}
    if "norm" in hparams:
        facts = {**(hparams.get("run_facts") or {}), "seq_len": hparams.get("seq_len")}  # as LlamaLM records them
        label = norm_label(hparams["norm"], hparams.get("norm_args"), facts)
    else:
        label = folder.parent.name
    run = RunData(label=label, source=str(folder), tokens_per_step=_tokens_per_step(folder / "config.yaml"))
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 1, "histograms": 1, "tensors": 1})
    events.Reload()  # reads what is flushed so far: a run in progress is read up to its last write

    def series(tag: str) -> list[tuple[int, float]]:
        by_step = {e.step: e.value for e in events.Scalars(tag)}  # a resume's repeated steps: the later value
        return sorted(by_step.items())

    tags = set(events.Tags()["scalars"])
    # one step count throughout, the optimizer step a value belongs to (``trainer.global_step`` after it, as
    # max_steps, the progress bar and the checkpoints count): the callbacks log at it, but ``LightningModule.log``
    # writes at the steps done *before* the batch, so a 40-step run's last loss, and the validation after its
    # step 40, are logged at 39
    run.train_loss = [(step + 1, value) for step, value in series("train/loss")] if "train/loss" in tags else []
    run.val_loss = [(step + 1, value) for step, value in series("val/loss")] if "val/loss" in tags else []
    for stat in profiles():
        layers = sorted((split[1], tag) for tag in tags if (split := split_layer_key(tag)) and split[0] == stat)
        if not layers:
            continue
        per_layer = [dict(series(tag)) for _, tag in layers]
        common = set.intersection(*(set(values) for values in per_layer))
        if common:  # the newest step every layer has (a run in progress may have written only some layers)
            last = max(common)
            run.profiles[stat] = (last, [values[last] for values in per_layer])
    for tag in ("stability/loss_spikes", "stability/grad_norm_spikes"):
        if tag in tags:
            run.scalars[tag] = series(tag)[-1][1]
    return run


def load_study_runs(path: str | Path, only: Sequence[str] = ()) -> list[RunData]:
    """The runs of a study's ``results.json`` (``python -m bhyt_pl study``, any kind and schema version: read by the
    study's own loader), optionally only those whose label matches one of the ``only`` patterns (``fnmatch``, e.g.
    ``'bhyt@*-s0'``)."""
    from bhyt_pl.study.record.results import load, results_path

    path = results_path(path)
    try:
        record = load(path)
    except ValueError as exc:
        raise UsageError(f"compare: {exc}") from None
    tokens_per_step = record.meta.get("tokens_per_step")
    runs = []
    for result in record.runs:
        spec = result.spec
        name = spec.label
        if only and not any(fnmatch.fnmatchcase(name, pattern) for pattern in only):
            continue
        label = norm_label(spec.norm, spec.norm_args) + f" [lr={spec.lr:g}, seed={spec.seed}]"
        run = RunData(
            label=label,
            source=f"{path}:{name}",
            tokens_per_step=tokens_per_step if isinstance(tokens_per_step, int) else None,
        )
        run.train_loss = [(int(s), float(v)) for s, v in result.losses]
        run.val_loss = [(int(result.steps_done or run.steps), float(result.val_loss))]
        for stat in depth_statistics():
            layers = layer_series(result.depth_final, stat.name)
            if layers:
                run.profiles[f"depth/{stat.name}"] = (run.steps, layers)
        for key in ("loss_spikes", "grad_norm_spikes"):
            if result.stability.get(key) is not None:
                run.scalars[f"stability/{key}"] = float(result.stability[key])
        runs.append(run)
    if not runs:
        raise UsageError(f"compare: no run of {str(path)!r} matches --only {' '.join(only)}")
    return runs


def load_runs(paths: Sequence[str | Path], only: Sequence[str] = ()) -> list[RunData]:
    """Every run named by ``paths`` (run folders, version folders, study results), in order; labels that
    would repeat get their folder appended."""
    runs: list[RunData] = []
    for p in map(Path, paths):
        if not p.exists():
            raise UsageError(f"compare: {str(p)!r} does not exist")
        if p.name == "results.json" or (p.is_dir() and (p / "results.json").is_file()):
            runs.extend(load_study_runs(p, only))
        else:
            runs.append(load_event_run(p))
    _distinguish(runs)
    return runs


def _distinguish(runs: Sequence[RunData]) -> None:
    """Append to each label that repeats the shortest tail of its run's path (at least ``<run>/version_N``) that
    no other run with that label shares: runs of one name from two ``--runs_dir`` differ in a folder above it."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    for label, group in groups.items():
        if len(group) < 2:
            continue
        parts = [Path(run.source).absolute().parts for run in group]
        for depth in range(2, max(map(len, parts)) + 1):
            tails = [str(Path(*p[-depth:])) for p in parts]
            if len(set(tails)) == len(tails):
                break
        for run, tail in zip(group, tails):
            run.label = f"{label} [{tail}]"


# ----------------------------------------------------------------------------- writing
def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return "nan" if math.isnan(value) else f"{value:.{digits}g}"


def markdown_table(runs: Sequence[RunData]) -> str:
    """Final values per run: the last logged value of each quantity (``-`` where the run has none)."""
    depth = depth_statistics()
    header = ["run", "last step", "tokens", "train loss", "val loss"]
    header += [f"last-layer {s.name.replace('_', ' ')}" for s in depth] + ["loss spikes", "grad-norm spikes"]
    rows = []
    for r in runs:
        if not (r.train_loss or r.val_loss or r.profiles or r.scalars):  # its event file is empty so far
            rows.append([r.label, "no logged data yet", *[""] * (len(header) - 2)])
            continue
        last_layer = [r.profiles.get(f"depth/{s.name}") for s in depth]
        rows.append(
            [
                r.label,
                str(r.steps),
                "-" if r.tokens is None else f"{r.tokens:,}",
                _fmt(r.train_loss[-1][1] if r.train_loss else None),
                _fmt(r.val_loss[-1][1] if r.val_loss else None),
                *(_fmt(profile[1][-1] if profile else None) for profile in last_layer),
                _fmt(r.scalars.get("stability/loss_spikes"), 6),
                _fmt(r.scalars.get("stability/grad_norm_spikes"), 6),
            ]
        )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def compare_figure(runs: Sequence[RunData]) -> Any:
    """The figure (a plain matplotlib ``Figure``, no pyplot state): the two losses, then one panel per profile
    (``profiles``), on two rows."""
    import math

    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = [(f"depth/{s.name}", f"{s.name.replace('_', ' ')} ({s.unit})", True) for s in depth_statistics()]
    panels += list(STABILITY_PROFILES)
    columns = math.ceil((2 + len(panels)) / 2)
    figure = Figure(figsize=(5 * columns, 8.5), dpi=100, layout="constrained")
    axes = figure.subplots(2, columns).ravel()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    by_tokens = all(r.tokens_per_step is not None for r in runs)
    x_label = "training tokens" if by_tokens else "step"
    for ax, attr, title in ((axes[0], "train_loss", "train loss"), (axes[1], "val_loss", "val loss")):
        for run, color in zip(runs, colors):
            points = getattr(run, attr)
            if points:
                scale = run.tokens_per_step if by_tokens else 1
                xs, ys = [s * scale for s, _ in points], [v for _, v in points]
                ax.plot(xs, ys, color=color, label=run.label, marker="o" if len(points) < 12 else None, ms=3)
        ax.set(title=title, xlabel=x_label, ylabel="loss (nats)")
    for ax, (stat, ylabel, log_scale) in zip(axes[2:], panels, strict=False):
        drawn = False
        for run, color in zip(runs, colors):
            if stat in run.profiles:
                step, values = run.profiles[stat]
                ax.plot(range(len(values)), values, color=color, marker="o", ms=3, label=f"{run.label} (step {step})")
                drawn = True
        ax.set(title=f"{stat}, last logged step", xlabel="layer", ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if drawn and log_scale:
            ax.set_yscale("log")
    for ax in axes:
        if ax.get_yscale() == "linear":  # 4.5582-4.5584 reads as itself, not as "+4.558" and 2e-4
            ax.ticklabel_format(axis="y", useOffset=False)
        if not drawn:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[2 + len(panels) :]:
        ax.set_visible(False)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return figure


def compare(paths: Sequence[str | Path], out: str | Path, only: Sequence[str] = ()) -> tuple[Path, Path, str]:
    """Read the runs, write the figure to ``out`` (PNG) and the table beside it (``.md``).

    Returns:
        ``(figure path, table path, table)``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    runs = load_runs(paths, only)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure = compare_figure(runs)
    FigureCanvasAgg(figure)
    figure.savefig(out, format="png")
    table = markdown_table(runs)
    table_path = out.with_suffix(".md")
    table_path.write_text(table)
    return out, table_path, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bhyt_pl compare",
        allow_abbrev=False,  # a shortened flag is an error, never read as the flag it starts
        description="Runs side by side: loss against tokens, depth profiles and stability in one figure, plus a "
        "markdown table of final values.",
    )
    parser.add_argument("runs", nargs="+", help="run folders (runs/<name> or runs/<name>/version_N) or results.json")
    parser.add_argument("--out", default="compare.png", help="the figure (PNG); the table goes beside it as .md")
    parser.add_argument("--only", nargs="*", default=[], help="labels of results.json runs to keep (glob patterns)")
    args = parser.parse_args(argv)
    figure_path, table_path, table = compare(args.runs, args.out, args.only)
    print(table, end="")
    print(f"wrote {figure_path} and {table_path}")
    return 0
