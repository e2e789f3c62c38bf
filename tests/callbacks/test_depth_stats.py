"""DepthStatsMonitor: logged statistics equal references computed here from block outputs run by hand."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl.callbacks import DepthStatsCollector, DepthStatsMonitor
from bhyt_pl.module import LlamaLM


class MemoryLogger(Logger):
    """Keeps every ``log_metrics`` call: ``history[step] = {name: value}``."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[int, dict[str, float]] = {}

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.history.setdefault(step, {}).update(metrics)


def hand_set_lm(norm: str = "rmsnorm", **norm_args) -> LlamaLM:
    """A tiny model whose every weight is a fixed function of its position (no RNG), gains perturbed too."""
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm=norm, norm_args=norm_args, seq_len=32, lr=1e-2, warmup_steps=0)
    lm.configure_model()
    with torch.no_grad():
        for k, (name, p) in enumerate(sorted(lm.model.named_parameters())):
            if p.ndim >= 2:  # matrices: a deterministic, non-trivial pattern of scale ~0.1
                idx = torch.arange(p.numel(), dtype=torch.float64)
                p.copy_((0.15 * torch.sin(0.37 * idx + k) + 0.02 * torch.cos(1.3 * idx)).reshape(p.shape))
            elif name.endswith("norms.attn_in.weight") or name.endswith("norms.mlp_in.weight"):
                p.copy_(1.0 + 0.1 * torch.cos(torch.arange(p.numel(), dtype=torch.float64)))
    lm.model.refresh_norm_constants()
    return lm


def first_batch(data: TokenDataModule) -> torch.Tensor:
    return next(iter(data.train_dataloader()))["input_ids"]


@torch.no_grad()
def reference_stats(lm: LlamaLM, ids: torch.Tensor) -> dict[str, list[float]]:
    """The statistics of docs/method.md, section 6 per block, float64, from blocks run one by one."""
    model = lm.model
    x = model.emb_norm(model.embed(ids))  # [B, T, d]
    cos, sin = model.rope(0, ids.shape[1], ids.device, x.dtype)
    out: dict[str, list[float]] = {k: [] for k in ("magnitude", "variance", "max_abs", "angular", "ratio", "rms_a",
                                                      "ratio_of_means", "ratio_first8", "ratio_rest")}  # fmt: skip
    for block in model.layers:
        y = block(x, cos, sin)
        x64, y64 = x.double(), y.double()
        out["magnitude"].append(y64.pow(2).sum(-1).sqrt().mean().item())  # mean over tokens of ||y_t||_2
        mean = y64.mean(-1, keepdim=True)
        out["variance"].append((y64 - mean).pow(2).mean(-1).mean().item())  # mean over tokens of Var_d(y_t)
        out["max_abs"].append(y64.abs().max().item())
        cosine = (x64 * y64).sum(-1) / (x64.norm(dim=-1) * y64.norm(dim=-1))
        out["angular"].append((1 - cosine).mean().item())
        out["rms_a"].append(x64.pow(2).mean(-1).sqrt().mean().item())
        if hasattr(block.norms, "c"):  # BHyT site B: approximated over exact second moment of h
            u = block.norms.attn_in(x)
            h = (x + block.attn(u, cos, sin)).double()
            lam, kappa = block.norms.attn_in.lambda_.double(), block.norms.attn_in.kappa
            approx = x64.pow(2).mean(-1) + block.norms.c.double() * lam**2 / kappa**2
            exact = h.pow(2).mean(-1)  # [B, T]
            out["ratio"].append((approx / exact).mean().item())
            out["ratio_of_means"].append((approx.mean() / exact.mean()).item())
            out["ratio_first8"].append((approx / exact)[:, :8].mean().item())
            out["ratio_rest"].append((approx / exact)[:, 8:].mean().item())
        x = y
    return out


def fit(lm: LlamaLM, monitor: DepthStatsMonitor, logger: Logger, **trainer_kwargs) -> L.Trainer:
    trainer = quiet_trainer(callbacks=[monitor], logger=logger, **trainer_kwargs)
    trainer.fit(lm, datamodule=TokenDataModule())
    return trainer


@pytest.mark.parametrize("norm", ["rmsnorm", "bhyt"])
def test_logged_statistics_equal_block_outputs_computed_by_hand(norm: str) -> None:
    lm = hand_set_lm(norm)
    expected = reference_stats(lm, first_batch(TokenDataModule()))  # the initial weights see step 1's batch
    logger = MemoryLogger()
    fit(lm, DepthStatsMonitor(every_n_steps=100, figures=False), logger, max_steps=2)
    assert sorted(logger.history) == [1]  # step 1 only (every 100)
    logged = logger.history[1]
    for i in range(TINY_OVERRIDES["n_layers"]):
        layer = f"layer_{i:02d}"
        assert logged[f"depth/magnitude/{layer}"] == pytest.approx(expected["magnitude"][i], rel=1e-5)
        assert logged[f"depth/variance/{layer}"] == pytest.approx(expected["variance"][i], rel=1e-5)
        assert logged[f"depth/max_abs/{layer}"] == pytest.approx(expected["max_abs"][i], rel=1e-5)
        assert logged[f"depth/angular_distance/{layer}"] == pytest.approx(expected["angular"][i], rel=1e-4, abs=1e-7)
        assert logged[f"depth/site_rms/attn_in/{layer}"] == pytest.approx(expected["rms_a"][i], rel=1e-5)
        if norm == "bhyt":
            assert logged[f"depth/bhyt_moment_ratio/{layer}"] == pytest.approx(expected["ratio"][i], rel=1e-5)
            for stat in ("ratio_of_means", "ratio_first8", "ratio_rest"):
                logged_value = logged[f"depth/bhyt_moment_{stat}/{layer}"]
                assert logged_value == pytest.approx(expected[stat][i], rel=1e-5), stat
            assert logged[f"depth/lambda/attn_in/{layer}"] == pytest.approx(2.0)
            assert logged[f"depth/lambda/mlp_in/{layer}"] == pytest.approx(1.0)
            assert f"depth/saturation/mlp_in/{layer}" in logged
        else:
            assert not any("lambda" in k or "saturation" in k or "ratio" in k for k in logged)
    # the statistics vary with depth in this model, so a wrong layer mapping could not pass
    assert expected["magnitude"][0] != pytest.approx(expected["magnitude"][1], rel=1e-3)


def test_derf_saturation_alpha_and_shift_against_the_erf_argument() -> None:
    """Derf reports through the BoundedSite interface: saturation of alpha * x + s, alpha and shift."""
    lm = hand_set_lm("derf", alpha_attn=8.0, alpha_mlp=0.5, shift_init=0.5)
    ids = first_batch(TokenDataModule())
    with torch.no_grad():
        x = lm.model.emb_norm(lm.model.embed(ids)).double()  # layer 0's site A input
        expected = (8.0 * x + 0.5).abs().gt(2.0).double().mean().item()
    assert 0.05 < expected < 0.95
    logger = MemoryLogger()
    fit(lm, DepthStatsMonitor(every_n_steps=100, figures=False), logger, max_steps=1)
    logged = logger.history[1]
    assert logged["depth/saturation/attn_in/layer_00"] == pytest.approx(expected, rel=1e-6)
    assert logged["depth/alpha/attn_in/layer_00"] == pytest.approx(8.0)
    assert logged["depth/shift/mlp_in/layer_01"] == pytest.approx(0.5)


def test_post_ln_residual_sites_are_observed() -> None:
    """Post-LN's sites sit after the residual adds: their input RMS is logged, the identities are skipped."""
    lm = hand_set_lm("post_ln")
    ids = first_batch(TokenDataModule())
    model = lm.model
    with torch.no_grad():  # layer 0's attn_res input: x + Attn(x), x the embeddings (no pre-norm)
        x = model.embed(ids)
        h = x + model.layers[0].attn(x, *model.rope(0, ids.shape[1], ids.device, x.dtype))
        expected = h.double().pow(2).mean(-1).sqrt().mean().item()
    logger = MemoryLogger()
    fit(lm, DepthStatsMonitor(every_n_steps=100, figures=False), logger, max_steps=1)
    logged = logger.history[1]
    assert logged["depth/site_rms/attn_res/layer_00"] == pytest.approx(expected, rel=1e-5)
    assert "depth/site_rms/mlp_res/layer_01" in logged
    assert not any("/attn_in/" in k or "saturation" in k for k in logged)


def test_dyt_saturation_and_alpha_against_the_tanh_argument() -> None:
    lm = hand_set_lm("dyt", alpha_attn=8.0, alpha_mlp=0.5)
    ids = first_batch(TokenDataModule())
    with torch.no_grad():
        x = lm.model.emb_norm(lm.model.embed(ids)).double()  # layer 0's site A input
        expected = (8.0 * x).abs().gt(2.0).double().mean().item()
    assert 0.05 < expected < 0.95  # a non-trivial fraction, so the check means something
    logger = MemoryLogger()
    fit(lm, DepthStatsMonitor(every_n_steps=100, figures=False), logger, max_steps=1)
    logged = logger.history[1]
    assert logged["depth/saturation/attn_in/layer_00"] == pytest.approx(expected, rel=1e-6)
    assert logged["depth/alpha/attn_in/layer_00"] == pytest.approx(8.0)
    assert logged["depth/alpha/mlp_in/layer_01"] == pytest.approx(0.5)


def test_hooks_exist_only_during_the_forward_of_logging_steps() -> None:
    seen: list[int] = []

    class CountHooks(L.Callback):  # runs after the monitor's on_train_batch_start (list order)
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            block = pl_module.model.layers[0]
            seen.append(len(block._forward_hooks) + len(block.norms.attn_in._forward_pre_hooks))

    lm = hand_set_lm("bhyt")
    monitor = DepthStatsMonitor(every_n_steps=2, figures=False)
    logger = MemoryLogger()
    trainer = quiet_trainer(callbacks=[monitor, CountHooks()], logger=logger, max_steps=5)
    trainer.fit(lm, datamodule=TokenDataModule())
    assert seen == [2, 2, 0, 2, 0]  # steps 1, 2 and 4 log; hooks present only on those
    assert sorted(logger.history) == [1, 2, 4]
    for module in lm.model.modules():  # nothing left behind
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_reduction_over_ranks_equals_statistics_of_the_joined_batch() -> None:
    lm = hand_set_lm("bhyt")
    ids = torch.randint(0, 64, (6, 32), generator=torch.Generator().manual_seed(3))
    local, remote, joined = (DepthStatsCollector(lm.model) for _ in range(3))
    with torch.no_grad():
        for collector, batch in ((local, ids[:2]), (remote, ids[2:]), (joined, ids)):  # ranks with 2 and 4 rows
            with collector:
                lm.model(batch)
    packed_remote: list[torch.Tensor] = []
    remote.compute(all_gather=lambda t: packed_remote.append(t) or t)  # what rank 1 contributes
    reduced = local.compute(all_gather=lambda t: torch.stack([t, packed_remote[0]]))
    assert reduced == pytest.approx(joined.compute(), rel=1e-6)


def test_tensorboard_event_file_has_scalars_and_figures(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lm = hand_set_lm("bhyt")
    logger = TensorBoardLogger(tmp_path, name="run")
    fit(lm, DepthStatsMonitor(every_n_steps=2, validation=True), logger, max_steps=2, val_check_interval=2,
        limit_val_batches=1)  # fmt: skip
    events = EventAccumulator(str(Path(logger.log_dir)), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    scalars, images = set(events.Tags()["scalars"]), set(events.Tags()["images"])
    for stat in ("magnitude", "variance", "max_abs", "angular_distance", "bhyt_moment_ratio"):
        assert f"depth/{stat}/layer_01" in scalars
        assert f"depth/{stat}" in images
    assert {
        "depth/site_rms/mlp_in/layer_00",
        "depth/saturation/attn_in/layer_01",
        "depth/lambda/mlp_in/layer_00",
    } <= scalars
    assert "depth_val/magnitude/layer_00" in scalars and "depth_val/magnitude" in images
    assert [e.step for e in events.Scalars("depth/magnitude/layer_00")] == [1, 2]
    assert [e.step for e in events.Images("depth/variance")] == [1, 2]
    width, height = events.Images("depth/variance")[0].width, events.Images("depth/variance")[0].height
    assert width > 100 and height > 100


def test_statistics_asked_for_are_logged_with_their_reductions() -> None:
    """The study's robust magnitudes on the training batch: the median token (a quantile over tokens, position 0 left
    out) and the mean token without the batch's two largest mean-|y| channels, against the blocks run by hand."""
    lm = hand_set_lm("rmsnorm")
    ids = first_batch(TokenDataModule())
    model = lm.model
    with torch.no_grad():
        x = model.emb_norm(model.embed(ids))
        cos, sin = model.rope(0, ids.shape[1], ids.device, x.dtype)
        expected = {"median": [], "top2": []}
        for block in model.layers:
            x = block(x, cos, sin)
            y = x.double()
            expected["median"].append(y[:, 1:].norm(dim=-1).flatten().sort().values[(4 * 31 - 1) // 2].item())
            keep = torch.ones(y.shape[-1], dtype=torch.bool)
            keep[y.abs().mean(dim=(0, 1)).topk(2).indices] = False
            expected["top2"].append(y[..., keep].norm(dim=-1).mean().item())
    logger = MemoryLogger()
    names = ["median_magnitude", "magnitude_top2_removed"]
    fit(lm, DepthStatsMonitor(every_n_steps=100, figures=False, statistics=names), logger, max_steps=1)
    logged = logger.history[1]
    for i in range(TINY_OVERRIDES["n_layers"]):
        assert logged[f"depth/median_magnitude/layer_{i:02d}"] == pytest.approx(expected["median"][i], rel=1e-5)
        assert logged[f"depth/magnitude_top2_removed/layer_{i:02d}"] == pytest.approx(expected["top2"][i], rel=1e-5)
    assert not any(k.startswith("depth/magnitude/") or k.startswith("depth/site_rms/") for k in logged)  # not asked


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_steps": 0}, "every_n_steps must be an int >= 1"),
        ({"saturation_threshold": 0}, "saturation_threshold"),
        ({"statistics": ["loudness"]}, "unknown statistic 'loudness'; registered: \\['magnitude'"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DepthStatsMonitor(**kwargs)


def test_should_log_schedule() -> None:
    monitor = DepthStatsMonitor(every_n_steps=100)
    assert [s for s in range(1, 401) if monitor.should_log(s)] == [1, 100, 200, 300, 400]
    assert not DepthStatsMonitor(every_n_steps=100, log_first_step=False).should_log(1)
    assert math.isclose(DepthStatsMonitor().saturation_threshold, 2.0)


def test_compiled_blocks_switch_the_monitor_off_with_a_warning() -> None:
    from types import SimpleNamespace

    lm = hand_set_lm("rmsnorm")
    for block in lm.model.layers:
        block.compile()  # lazy: nothing is traced until the first call, which never happens here
    monitor = DepthStatsMonitor(every_n_steps=1)
    with pytest.warns(UserWarning, match="blocks are compiled"):
        monitor.on_train_batch_start(SimpleNamespace(global_step=0, accumulate_grad_batches=1), lm, None, 0)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in lm.model.modules())
