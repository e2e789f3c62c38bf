"""Scalars and figures reach every Lightning logger through its own API (``bhyt_pl.callbacks.loggers``),
checked in each logger's own files with the real libraries, offline: TensorBoard event files, CSV's
``metrics.csv`` and PNG files, MLflow through its client (a local store), W&B's offline run (its history
and summary records, and its media folder)."""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bhyt_pl.callbacks.loggers import figure_path, log_figures, takes_figures
from bhyt_pl.cli import main
from bhyt_pl.runs import RunLogger, run_loggers

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes" / "tiny.yaml")
PNG = b"\x89PNG\r\n\x1a\n"


def _figure(value: float) -> Figure:
    figure = Figure(figsize=(2.0, 1.5), dpi=50)
    figure.add_subplot().plot([0, 1, 2], [value, 2 * value, 3 * value])
    return figure


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG, path
    return struct.unpack(">II", data[16:24])  # IHDR width, height


class _ScalarsOnly(Logger):
    """A logger without image support: it must get nothing and break nothing."""

    name, version = "scalars_only", 0

    def log_metrics(self, metrics, step=None) -> None:
        pass

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


# ----------------------------------------------------------------------------- log_figures, one call
def test_log_figures_writes_through_each_loggers_api(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tensorboard = TensorBoardLogger(tmp_path / "tb", name="run")
    csv_logger = CSVLogger(tmp_path / "csv", name="run")
    mlflow = MLFlowLogger(experiment_name="figures", tracking_uri=f"file:{tmp_path / 'mlruns'}")
    loggers = [tensorboard, csv_logger, mlflow, _ScalarsOnly()]
    assert [takes_figures(lg) for lg in loggers] == [True, True, True, False]

    calls = []

    def draw() -> dict[str, Figure]:
        calls.append(1)
        return {"depth/magnitude": _figure(1.0), "stability/grad_norm": _figure(2.0)}

    log_figures(loggers, draw, step=7)
    assert len(calls) == 1  # drawn once for all loggers
    tensorboard.experiment.flush()

    events = EventAccumulator(tensorboard.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == ["depth/magnitude", "stability/grad_norm"]
    image = events.Images("depth/magnitude")[0]
    assert image.step == 7 and (image.width, image.height) == (100, 75)  # 2.0 x 1.5 in at 50 dpi

    for tag in ("depth/magnitude", "stability/grad_norm"):
        assert _png_size(Path(csv_logger.log_dir) / figure_path(tag, 7)) == (100, 75)
    assert figure_path("depth/magnitude", 7) == "figures/depth/magnitude/step_000007.png"

    artifacts = [a.path for a in mlflow.experiment.list_artifacts(mlflow.run_id, "figures/depth/magnitude")]
    assert artifacts == ["figures/depth/magnitude/step_000007.png"]


def test_log_figures_draws_nothing_without_an_image_logger() -> None:
    def draw() -> dict[str, Figure]:
        raise AssertionError("drawn although no logger takes figures")

    log_figures([_ScalarsOnly()], draw, step=1)
    log_figures([], draw, step=1)


# ----------------------------------------------------------------------------- recipes select loggers
def test_recipe_loggers_keep_the_run_folder_and_take_its_name(tmp_path: Path) -> None:
    run_logger = {"class_path": "bhyt_pl.runs.RunLogger", "init_args": {"save_dir": "r", "name": "tiny-bhyt"}}
    wandb = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"save_dir": ".", "name": None}}
    mlflow = {
        "class_path": "lightning.pytorch.loggers.MLFlowLogger",
        "init_args": {"save_dir": "./mlruns", "run_name": None, "tracking_uri": None, "artifact_location": None},
    }
    csv_logger = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "x", "name": "lightning_logs"},
    }
    runs = str(tmp_path / "r")
    loggers = run_loggers([wandb, mlflow, csv_logger], run_logger, runs, "tiny-bhyt")
    assert loggers[0] is run_logger and len(loggers) == 4
    assert wandb["init_args"] == {"save_dir": str(tmp_path / "r" / "tiny-bhyt"), "name": "tiny-bhyt"}
    assert mlflow["init_args"]["tracking_uri"] == f"sqlite:///{tmp_path / 'r' / 'mlflow.db'}"
    assert mlflow["init_args"]["artifact_location"] == str(tmp_path / "r" / "mlartifacts")
    assert mlflow["init_args"]["run_name"] == "tiny-bhyt"
    assert csv_logger["init_args"] == {"save_dir": str(tmp_path / "r" / "tiny-bhyt"), "name": "csv"}

    # the user's own choices stay; a TensorBoard logger of the recipe replaces the run folder's
    server = {
        "class_path": "lightning.pytorch.loggers.MLFlowLogger",
        "init_args": {"save_dir": "./mlruns", "run_name": "mine", "tracking_uri": "http://host:5000"},
    }
    tensorboard = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "tb"}}
    assert run_loggers([tensorboard, server], run_logger, runs, "tiny-bhyt") == [tensorboard, server]
    assert server["init_args"] == {"save_dir": "./mlruns", "run_name": "mine", "tracking_uri": "http://host:5000"}


def test_logger_presets_stack_on_a_recipe(tmp_path: Path) -> None:
    presets = [str(ROOT / "recipes" / "loggers" / f"{name}.yaml") for name in ("csv", "mlflow")]
    args = ["--config", TINY, "--config", presets[0], "--config", presets[1], "--runs_dir", str(tmp_path)]
    cli = main(args, run=False)
    loggers = cli.trainer.loggers
    assert [type(lg) for lg in loggers] == [RunLogger, CSVLogger, MLFlowLogger]
    assert Path(loggers[1].log_dir) == tmp_path / "tiny-rmsnorm" / "csv" / "version_0"
    assert loggers[2]._run_name == "tiny-rmsnorm" and loggers[2]._experiment_name == "bhyt_pl"
    # no logger: the default run folder; logger false: none
    assert [type(lg) for lg in main(["--config", TINY, "--runs_dir", str(tmp_path)], run=False).trainer.loggers] == [
        RunLogger
    ]
    no_logger = main(["--config", TINY, "--runs_dir", str(tmp_path), "--trainer.logger", "false"], run=False)
    assert no_logger.trainer.loggers == []


# ----------------------------------------------------------------------------- a real run, every logger
def _wandb_records(path: Path):
    """The protobuf records of a W&B run file (``run-<id>.wandb``): a LevelDB-format log, 32 KiB blocks of
    chunks with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) after W&B's own
    7-byte file header."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def _item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


@pytest.fixture(scope="module")
def every_logger_run(tmp_path_factory) -> Path:
    """20 steps of a small model with callbacks/paper.yaml and the W&B (offline), MLflow and CSV presets."""
    tmp = tmp_path_factory.mktemp("loggers")
    job = tmp / "job.yaml"
    job.write_text(
        "trainer: {max_steps: 20, val_check_interval: 10, limit_val_batches: 2, enable_progress_bar: false,"
        " enable_model_summary: false}\n"
        "model: {overrides: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, mlp_dim: 48, max_seq_len: 64}}\n"
        "data: {init_args: {seq_len: 32, batch_size: 4}}\n"
    )
    loggers = [f"recipes/loggers/{name}.yaml" for name in ("wandb", "mlflow", "csv")]
    argv = ["-m", "bhyt_pl", "fit", "--config", TINY, "--config", "callbacks/paper.yaml"]
    for preset in loggers:
        argv += ["--config", preset]
    argv += ["--config", str(job), "--runs_dir", str(tmp / "runs"), "--run_name", "every"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "PL_", "PYTEST_"))}
    env.update(
        WANDB_MODE="offline", WANDB_SILENT="true", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"
    )
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp / "runs"


TAGS = ("train/loss", "depth/magnitude/layer_01", "stability/grad_norm/layer_00", "train/tokens_per_sec")
FIGURES = ("depth/magnitude", "depth/variance", "stability/grad_norm", "stability/attn_entropy")


def _assert_same_series(logged: list[tuple[int, float]], expected: list[tuple[int, float]], tag: str) -> None:
    assert [step for step, _ in logged] == [step for step, _ in expected], tag
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6), tag


def _tensorboard(runs: Path) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    events = EventAccumulator(str(runs / "every" / "version_0"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return scalars, set(events.Tags()["images"])


@pytest.mark.slow
def test_tensorboard_and_csv_hold_the_scalars_and_figures(every_logger_run: Path) -> None:
    scalars, images = _tensorboard(every_logger_run)
    assert set(TAGS) <= set(scalars) and set(FIGURES) <= images
    folder = every_logger_run / "every" / "csv" / "version_0"
    rows = list(csv.DictReader((folder / "metrics.csv").open()))
    for tag in TAGS:  # the same values at the same steps as TensorBoard's
        logged = [(int(r["step"]), float(r[tag])) for r in rows if r.get(tag)]
        _assert_same_series(logged, scalars[tag], tag)
    for tag in FIGURES:  # depth and stability figures at step 1 (paper.yaml: step 1, then every 100)
        assert _png_size(folder / figure_path(tag, 1)) == (360, 240)  # depth_figures: 4.5 x 3 in at 80 dpi


@pytest.mark.slow
def test_mlflow_holds_the_scalars_and_figures(every_logger_run: Path) -> None:
    from mlflow.tracking import MlflowClient

    scalars, _ = _tensorboard(every_logger_run)
    client = MlflowClient(tracking_uri=f"sqlite:///{every_logger_run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("bhyt_pl")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "every"
    for tag in TAGS:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        _assert_same_series(history, scalars[tag], tag)
    for tag in FIGURES:
        paths = [a.path for a in client.list_artifacts(run.info.run_id, f"figures/{tag}")]
        assert paths == [figure_path(tag, 1)]
        local = Path(client.download_artifacts(run.info.run_id, figure_path(tag, 1), str(every_logger_run / "dl")))
        assert _png_size(local) == (360, 240)


@pytest.mark.slow
def test_wandb_offline_run_holds_the_scalars_and_figures(every_logger_run: Path) -> None:
    scalars, _ = _tensorboard(every_logger_run)
    (run_dir,) = (every_logger_run / "every" / "wandb").glob("offline-run-*")
    (run_file,) = run_dir.glob("run-*.wandb")
    history: list[dict] = []
    summary: dict = {}
    name = None
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({_item_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            summary.update({_item_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "run":
            name = record.run.display_name
    assert name == "every"
    for tag in TAGS:
        logged = [(h["trainer/global_step"], h[tag]) for h in history if tag in h]
        _assert_same_series(logged, scalars[tag], tag)
        assert summary[tag] == pytest.approx(scalars[tag][-1][1], rel=1e-6)  # the last value
    for tag in FIGURES:  # an image entry is stored under nested keys: <tag>/_type, <tag>/filenames, ...
        images = [h for h in history if f"{tag}/_type" in h]
        assert len(images) == 1 and images[0][f"{tag}/_type"] == "images/separated", tag
        assert images[0]["trainer/global_step"] == 1
        (filename,) = images[0][f"{tag}/filenames"]
        assert filename.startswith(f"media/images/{tag}_") and _png_size(run_dir / "files" / filename) == (360, 240)
