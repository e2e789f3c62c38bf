"""``python -m bhyt_pl compare``: runs written by hand as TensorBoard event files (one finished, one shorter
and still open) and as a study's ``results.json``; the table and the figure's lines hold exactly those values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from bhyt_pl.cli import main
from bhyt_pl.compare import compare_figure, load_runs, markdown_table
from bhyt_pl.errors import UsageError


def _write_run(folder: Path, norm: str, norm_args: dict, steps: int, *, val: bool, stability: bool, close: bool):
    """A run version folder as bhyt_pl writes it: hparams.yaml, config.yaml and scalars. Loss at optimizer step s
    is 10 - s / 2, written at s - 1 as ``LightningModule.log`` writes it; magnitude at layer l and step s is
    (l + 1) * s, written at s as the callbacks write it (``trainer.global_step``); the global batch is 2 devices x
    4 x 16 tokens, accumulated twice: 256 tokens a step."""
    folder.mkdir(parents=True)
    hparams = {"norm": norm, "norm_args": norm_args, "lr": 1e-3, "seq_len": 16}
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    config = {
        "trainer": {"devices": 2, "num_nodes": 1, "accumulate_grad_batches": 2},
        "data": {"class_path": "bhyt_pl.data.C4DataModule", "init_args": {"batch_size": 4, "seq_len": 16}},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    writer = SummaryWriter(str(folder))
    for step in range(1, steps + 1):
        writer.add_scalar("train/loss", 10 - step / 2, step - 1)
        if val and step % 4 == 0:
            writer.add_scalar("val/loss", 11 - step / 2, step - 1)
        if step in (1, steps):
            for layer in range(3):
                writer.add_scalar(f"depth/magnitude/layer_{layer:02d}", (layer + 1) * step, step)
                writer.add_scalar(f"depth/variance/layer_{layer:02d}", (layer + 1) * step / 10, step)
                if stability:
                    writer.add_scalar(f"stability/grad_norm/layer_{layer:02d}", 1 / (layer + 1), step)
        if stability:
            writer.add_scalar("stability/loss_spikes", step // 5, step)
            writer.add_scalar("stability/grad_norm_spikes", 0, step)
    writer.flush()
    if close:
        writer.close()
    return writer


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    finished = tmp_path / "runs" / "tiny-rmsnorm"
    _write_run(finished / "version_0", "rmsnorm", {}, 4, val=False, stability=False, close=True)  # older version
    _write_run(finished / "version_1", "rmsnorm", {}, 12, val=True, stability=True, close=True)
    open_run = tmp_path / "runs" / "tiny-bhyt" / "version_0"  # seq_len (T) is the run's: not in the label
    writer = _write_run(
        open_run, "bhyt", {"lambda_attn": 1.0, "seq_len": 16}, 6, val=False, stability=False, close=False
    )
    yield [finished, open_run]  # a run folder (newest version) and a version folder still being written
    writer.close()


def test_table_holds_each_runs_final_values(two_runs: list[Path]) -> None:
    runs = load_runs(two_runs)
    assert [r.label for r in runs] == ["rmsnorm", "bhyt (lambda_attn=1.0)"]
    assert runs[0].source.endswith("version_1") and runs[0].tokens_per_step == 256
    table = markdown_table(runs).splitlines()
    assert table[0].startswith("| run | last step | tokens | train loss | val loss | last-layer magnitude")
    assert table[2] == "| rmsnorm | 12 | 3,072 | 4 | 5 | 36 | 3.6 | 2 | 0 |"  # 10 - 12/2, 11 - 12/2, 3 x 12
    assert table[3] == "| bhyt (lambda_attn=1.0) | 6 | 1,536 | 7 | - | 18 | 1.8 | - | - |"


def test_figure_draws_losses_against_tokens_and_the_last_profiles(two_runs: list[Path]) -> None:
    runs = load_runs(two_runs)
    axes = compare_figure(runs).axes
    train = axes[0].lines
    assert list(train[0].get_xdata()) == [256 * s for s in range(1, 13)]
    assert list(train[0].get_ydata()) == [10 - s / 2 for s in range(1, 13)]
    assert list(train[1].get_xdata()) == [256 * s for s in range(1, 7)]  # the shorter run ends where it is
    assert list(axes[1].lines[0].get_xdata()) == [1024, 2048, 3072] and len(axes[1].lines) == 1
    magnitude = axes[2].lines
    assert [list(line.get_ydata()) for line in magnitude] == [[12, 24, 36], [6, 12, 18]]  # last step, not step 1
    assert "step 12" in magnitude[0].get_label()
    assert list(axes[4].lines[0].get_ydata()) == pytest.approx([1, 1 / 2, 1 / 3])
    assert not axes[5].lines and axes[5].texts  # no attention entropy logged: said, not drawn empty


def test_steps_are_optimizer_steps_in_the_table_and_the_legend_alike(tmp_path: Path) -> None:
    """A 40-step run's table said "last step 39" (Lightning writes ``self.log`` values at the steps done before
    the batch) where its depth legend said "step 40" (callbacks log at ``trainer.global_step``); its tokens were
    39 steps' worth. Here Lightning itself writes a 4-step run, validating every 2 steps."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    from lm_fixtures import TINY_OVERRIDES, TokenDataModule

    from bhyt_pl import LlamaLM
    from bhyt_pl.callbacks import DepthStatsMonitor

    logger = TensorBoardLogger(str(tmp_path), name="run", version=0)
    trainer = L.Trainer(max_steps=4, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1,
                        log_every_n_steps=1, logger=logger, callbacks=[DepthStatsMonitor(every_n_steps=2)],
                        accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(LlamaLM(overrides=TINY_OVERRIDES), TokenDataModule(seq_len=16, batch_size=2))
    assert trainer.global_step == 4
    (config := tmp_path / "run" / "version_0" / "config.yaml").write_text(
        yaml.safe_dump({"data": {"init_args": {"batch_size": 2, "seq_len": 16}}})
    )  # what the CLI saves beside the events: 32 tokens a step
    (run,) = load_runs([config.parent])
    assert [s for s, _ in run.train_loss] == [1, 2, 3, 4] and [s for s, _ in run.val_loss] == [2, 4]
    assert run.profiles["depth/magnitude"][0] == run.steps == 4 and run.tokens == 4 * 32
    assert markdown_table([run]).splitlines()[2].startswith("| rmsnorm | 4 | 128 |")  # its hparams.yaml has tuples
    magnitude = compare_figure([run]).axes[2].lines
    assert magnitude[0].get_label() == "rmsnorm (step 4)"


def test_command_writes_figure_and_table(two_runs: list[Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "out" / "cmp.png"
    assert main(["compare", *map(str, two_runs), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = out.with_suffix(".md").read_text()
    assert "| rmsnorm | 12 |" in table and table in capsys.readouterr().out


def test_same_labels_get_their_folders(tmp_path: Path) -> None:
    for name in ("a", "b"):
        _write_run(tmp_path / name / "version_0", "dyt", {}, 2, val=False, stability=False, close=True)
    assert [r.label for r in load_runs([tmp_path / "a", tmp_path / "b"])] == ["dyt [a/version_0]", "dyt [b/version_0]"]


def test_study_results_json(tmp_path: Path) -> None:
    def result(label: str, norm: str, norm_args: dict, losses: list[float]) -> dict:
        return {
            "spec": {"label": label, "norm": norm, "norm_args": norm_args, "lr": 0.003, "seed": 42},
            "steps_done": len(losses),
            "losses": [[i + 1, v] for i, v in enumerate(losses)],
            "val_loss": losses[-1] + 0.25,
            "depth_final": {"magnitude/layer_00": 1.0, "magnitude/layer_01": 4.0, "variance/layer_00": 0.5},
            "stability": {"loss_spikes": 0, "grad_norm_spikes": 3, "steps": []},
        }

    data = {
        "meta": {"tokens_per_step": 512},
        "runs": [result("rmsnorm@lr0.003-s0", "rmsnorm", {}, [9.0, 8.0]), result("bhyt@lr0.003-s0", "bhyt", {}, [7.0])],
    }
    path = tmp_path / "study" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(data))
    runs = load_runs([path.parent], only=["bhyt@*"])
    assert [r.label for r in runs] == ["bhyt [lr=0.003, seed=42]"]
    assert markdown_table(runs).splitlines()[2] == "| bhyt [lr=0.003, seed=42] | 1 | 512 | 7 | 7.25 | 4 | 0.5 | 0 | 3 |"
    both = load_runs([path])
    assert [r.train_loss for r in both] == [[(1, 9.0), (2, 8.0)], [(1, 7.0)]]
    with pytest.raises(UsageError, match="no run of .* matches --only nothing"):
        load_runs([path], only=["nothing"])


def test_bad_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'/nonexistent/run' does not exist"):
        load_runs(["/nonexistent/run"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="has no TensorBoard event files"):
        load_runs([tmp_path / "empty"])


def test_missing_values_print_as_dashes_and_a_diverged_loss_as_nan(tmp_path: Path) -> None:
    _write_run(tmp_path / "r" / "version_0", "rmsnorm", {}, 1, val=False, stability=False, close=True)
    (run,) = load_runs([tmp_path / "r"])
    run.train_loss = [(1, math.nan)]
    assert markdown_table([run]).splitlines()[2] == "| rmsnorm | 1 | 256 | nan | - | 3 | 0.3 | - | - |"


def test_a_run_without_logged_data_says_so(tmp_path: Path) -> None:
    """A run whose event file is still empty was reported as "last step 0" with every value "-"."""
    _write_run(tmp_path / "done" / "version_0", "rmsnorm", {}, 1, val=False, stability=False, close=True)
    (tmp_path / "new" / "version_0").mkdir(parents=True)
    (tmp_path / "new" / "version_0" / "events.out.tfevents.1796000000.host.1.0").write_bytes(b"")
    table = markdown_table(load_runs([tmp_path / "done", tmp_path / "new"])).splitlines()
    assert table[2].startswith("| rmsnorm | 1 | 256 |")
    assert table[3] == "| new | no logged data yet |  |  |  |  |  |  |  |"


def test_runs_of_one_name_from_two_runs_dirs_get_distinct_labels(tmp_path: Path) -> None:
    """Both were labelled ``rmsnorm [tiny-rmsnorm/version_0]``: the folder that differs sits above the run."""
    for runs_dir in ("runs-a", "runs-b"):
        _write_run(tmp_path / runs_dir / "tiny-rmsnorm" / "version_0", "rmsnorm", {}, 2, val=False, stability=False,
                   close=True)  # fmt: skip
    _write_run(tmp_path / "runs-a" / "tiny-bhyt" / "version_0", "bhyt", {}, 2, val=False, stability=False, close=True)
    runs = load_runs([tmp_path / "runs-a" / "tiny-rmsnorm", tmp_path / "runs-b" / "tiny-rmsnorm",
                      tmp_path / "runs-a" / "tiny-bhyt"])  # fmt: skip
    assert [r.label for r in runs] == [
        "rmsnorm [runs-a/tiny-rmsnorm/version_0]", "rmsnorm [runs-b/tiny-rmsnorm/version_0]", "bhyt"
    ]  # fmt: skip
    same = load_runs([tmp_path / "runs-a" / "tiny-bhyt"] * 2)  # one run given twice: its whole path, twice
    assert [r.label for r in same] == [f"bhyt [{tmp_path / 'runs-a' / 'tiny-bhyt' / 'version_0'}]"] * 2


def test_a_flat_profile_is_drawn_with_its_values_not_an_offset(tmp_path: Path) -> None:
    """Attention entropy of 4.5582-4.5584 nats was drawn as "+4.558" with ticks from 0.000175 to 0.000425."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from bhyt_pl.compare import RunData

    run = RunData(label="bhyt", source=str(tmp_path), train_loss=[(1, 5.0)])
    run.profiles["stability/attn_entropy"] = (10, [4.5583, 4.5584, 4.5583, 4.5582])
    figure = compare_figure([run])
    FigureCanvasAgg(figure).draw()
    entropy = figure.axes[5]
    assert entropy.yaxis.get_offset_text().get_text() == ""
    labels = [t.get_text() for t in entropy.get_yticklabels() if t.get_text()]
    assert labels and all(float(label.replace("\u2212", "-")) > 4.5 for label in labels), labels


def test_a_shortened_flag_is_refused_not_read_as_the_flag_it_starts(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(tmp_path), "--onl", "bhyt@*"])  # not --only
    assert exit_info.value.code == 2 and "unrecognized arguments: --onl" in capsys.readouterr().err
