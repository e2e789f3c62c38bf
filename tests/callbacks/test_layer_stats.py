"""The per-layer statistics registry (``bhyt_pl.callbacks.layer_stats``): summaries by hand, profiles of flat
statistics, declarations that are refused with their reason, and a statistic declared in this file alone that is
collected, logged, carried in ``results.json``, summarised, claimable and shown in the study's report and in
``compare``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl.callbacks import DepthStatsCollector, DepthStatsMonitor
from bhyt_pl.callbacks.layer_stats import (
    MEAN,
    ByScheme,
    FromProfile,
    LayerStatistic,
    OnBlockOutput,
    Quantile,
    Summary,
    growth,
    growth_slope,
    layer_profile,
    log_slope,
    register_statistic,
    statistic,
    statistics,
    unregister_statistic,
)
from bhyt_pl.module import LlamaLM
from bhyt_pl.study.run.callbacks import MemoryLogger


def _profile(n: int, first: float, ratio: float) -> list[float]:
    return [first * ratio**i for i in range(n)]


def test_growth_by_hand() -> None:
    # 8 layers, layer L/4 = 2: ln(values[7] / values[1]); a geometric profile has slope ln(ratio) per layer
    values = [100.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert growth(values) == pytest.approx(math.log(8.0 / 2.0))
    assert growth_slope(_profile(8, 1.0, 1.5)) == pytest.approx(math.log(1.5))
    assert growth([1.0, 1.0, 1.0, 1.0]) == 0.0 and math.isnan(growth([0.0, 1.0, 1.0, 1.0]))


def test_log_slope_of_a_geometric_profile() -> None:
    # magnitude 3 * 1.5**(l-1): ln grows by ln 1.5 per layer; layer 1 (an outlier here) is left out
    values = [100.0] + [3 * 1.5 ** (layer - 1) for layer in range(2, 9)]
    assert log_slope(values) == pytest.approx(math.log(1.5))
    assert math.isnan(log_slope([1.0, 2.0]))  # one point from layer 2 on


def test_summaries_of_a_profile_by_hand() -> None:
    profile = [4.0, 1.0, 2.0, 8.0]  # L = 4, layer L/4 = 1
    assert Summary("last").value(profile) == 8.0 and math.isnan(Summary("last").value([]))
    assert Summary("growth").value(profile) == pytest.approx(math.log(8.0 / 4.0))
    assert Summary("layer_mean").value([0.25, math.nan, 0.75]) == 0.5  # finite values only
    # slope of ln 1, ln 2, ln 8 over layers 2..4: least squares of (2, 0), (3, ln 2), (4, 3 ln 2) = 1.5 ln 2
    assert Summary("slope").value(profile) == pytest.approx(1.5 * math.log(2.0))
    assert Summary("growth").metric("variance") == "variance_growth" and Summary("last").log


def test_a_profile_of_flat_statistics_means_a_layers_sites() -> None:
    stats = {"magnitude/layer_01": 2.0, "magnitude/layer_00": 1.0, "magnitude_top2_removed/layer_00": 9.0}
    stats.update({"saturation/attn_in/layer_00": 0.2, "saturation/mlp_in/layer_00": 0.6})
    stats["saturation/mlp_in/layer_02"] = 1.0
    assert layer_profile(stats, "magnitude") == [1.0, 2.0]  # depth order; a longer name is another statistic
    assert layer_profile(stats, "saturation") == [pytest.approx(0.4), 1.0]  # layers with the statistic only


def test_a_quantile_is_declared_in_range() -> None:
    assert Quantile(0.5).q == 0.5 and statistic("median_magnitude").reduction == Quantile(0.5)
    with pytest.raises(ValueError, match=r"Quantile q must be in \[0, 1\]"):
        Quantile(1.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "a/b"}, "name must be letters, digits and '_'"),
        ({"measure": lambda x, y: y}, "measure must be OnBlockOutput, OnSiteInput, ByScheme or FromProfile"),
        ({"reduction": "median"}, r"reduction must be MEAN, MAX or Quantile\(q\)"),
        ({"skip_tokens": -1}, "skip_tokens must be >= 0"),
        ({"summaries": (Summary("last"), Summary("last"))}, "two summaries share a metric name"),
        ({"measure": FromProfile("magnitude", lambda p, d: p), "monitor": True}, "neither monitored nor recorded"),
    ],
)
def test_a_declaration_is_refused_with_its_reason(kwargs: dict, message: str) -> None:
    fields = {"name": "new", "unit": "1", "description": "d", "measure": ByScheme(), **kwargs}
    with pytest.raises(ValueError, match=message):
        LayerStatistic(**fields)


def test_registration_refuses_a_taken_name_or_metric_and_an_unknown_source() -> None:
    with pytest.raises(ValueError, match="'magnitude' is already registered"):
        register_statistic(LayerStatistic("magnitude", "1", "d", ByScheme()))
    # a statistic named magnitude_growth summarised over layers would be metric "magnitude_growth": magnitude's growth
    taken = LayerStatistic("magnitude_growth", "1", "d", ByScheme(), summaries=(Summary("layer_mean"),))
    with pytest.raises(ValueError, match="metric names already taken .*'magnitude_growth': 'magnitude'"):
        register_statistic(taken)
    with pytest.raises(ValueError, match="computed from 'nothing', which is not registered"):
        register_statistic(LayerStatistic("derived", "1", "d", FromProfile("nothing", lambda p, d: p)))
    with pytest.raises(ValueError, match="unknown statistic 'nothing'; registered: \\['magnitude'"):
        statistic("nothing")


def test_the_monitor_logs_the_statistics_declared_for_it() -> None:
    assert [s.name for s in statistics() if s.monitor] == [
        "magnitude",
        "variance",
        "angular_distance",
        "max_abs",
        "site_rms",
    ]


# ----------------------------------------------------------------------------- a statistic declared here alone
@pytest.fixture
def token_rms() -> Iterator[LayerStatistic]:
    """The root mean square of a block output's token, ``sqrt(mean_d y_t^2)``: the magnitude per coordinate, measured
    instead of derived. Registered for one test and removed after it."""
    stat = register_statistic(
        LayerStatistic(
            "token_rms",
            "sqrt(mean_d y_t^2), mean over tokens",
            "the root mean square of a token",
            OnBlockOutput(lambda x, y: y.pow(2).mean(dim=-1).sqrt()),
            MEAN,
            monitor=True,
            trajectory=True,
            summaries=(
                Summary("last", "last-layer token RMS", 0.1, "last-layer token RMS"),
                Summary("growth", "ln token RMS growth L/4..L"),
            ),
        )
    )
    yield stat
    unregister_statistic(stat.name)


@torch.no_grad()
def _reference_rms(lm: LlamaLM, ids: torch.Tensor) -> list[float]:
    """float64 mean over tokens of sqrt(mean_d y_t^2) for every block, blocks run one by one."""
    model = lm.model.eval()
    x = model.emb_norm(model.embed(ids))
    cos, sin = model.rope(0, ids.shape[1], ids.device, x.dtype)
    out = []
    for block in model.layers:
        x = block(x, cos, sin)
        out.append(x.double().pow(2).mean(-1).sqrt().mean().item())
    return out


def test_a_statistic_declared_here_is_collected_and_logged(token_rms: LayerStatistic) -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32, lr=1e-2, warmup_steps=0)
    lm.configure_model()
    ids = next(iter(TokenDataModule().train_dataloader()))["input_ids"]
    expected = _reference_rms(lm, ids)
    collector = DepthStatsCollector(lm.model, statistics=["token_rms"])
    with collector, torch.no_grad():
        lm.model(ids)
    collected = collector.compute()
    assert [collected[f"token_rms/layer_{i:02d}"] for i in range(len(expected))] == pytest.approx(expected, rel=1e-5)
    assert not any(k.startswith("magnitude/") for k in collected)  # only what was asked (and the scheme's own)
    logger = MemoryLogger()
    monitor = DepthStatsMonitor(every_n_steps=100, figures=False)
    quiet_trainer(callbacks=[monitor], logger=logger, max_steps=1).fit(lm, datamodule=TokenDataModule())
    last = f"depth/token_rms/layer_{len(expected) - 1:02d}"
    assert [step for step, _ in logger.metrics[last]] == [1]  # monitored: logged by default, at step 1
    assert "depth/magnitude/layer_00" in logger.metrics


@pytest.mark.slow
def test_a_statistic_declared_here_reaches_results_json_the_claims_and_the_report(
    token_rms: LayerStatistic, tmp_path: Path
) -> None:
    from bhyt_pl.compare import load_study_runs
    from bhyt_pl.compare import markdown_table as compare_table
    from bhyt_pl.study import main
    from bhyt_pl.study.protocol.claims import ClaimSpec, evaluate
    from bhyt_pl.study.protocol.metrics import value
    from bhyt_pl.study.record.results import load

    out = tmp_path / "study"
    argv = ["--quick", "--layers", "2", "--steps", "2", "--seq-len", "32", "--batch-size", "2", "--val-batches", "4"]
    argv += ["--shuffle-buffer", "4", "--workers", "1", "--no-compile", "--seeds", "2", "--lrs", "3e-3"]
    argv += ["--trajectory-every", "1", "--no-importance", "--schemes", "rmsnorm", "bhyt", "--out", str(out)]
    assert main(argv) == 0
    # carried in results.json: the final statistics and every trajectory point
    record = load(out)
    run = next(r for r in record.runs if r.spec.label == "bhyt@lr0.003-steps2-s1")
    assert {"token_rms/layer_00", "token_rms/layer_01"} <= set(run.depth_final)
    assert [len(p["token_rms"]) for p in run.trajectory] == [2, 2, 2]  # steps 0, 1 and the end
    # summarised: the measured RMS equals the magnitude per coordinate derived from the magnitude
    rms, derived = value(run, "token_rms", compare=False), value(run, "magnitude_per_coordinate", compare=False)
    assert rms == pytest.approx(derived, rel=1e-3) and value(run, "token_rms") == pytest.approx(math.log(rms))
    assert math.isfinite(value(run, "token_rms_growth"))
    # claimable, within its declared margin
    claim = ClaimSpec("BHyT ~ RMSNorm in token RMS", "Figure 3", "A", "B", "token_rms", "matched", "equivalent")
    assert claim.margin_value == 0.1
    (evaluated,), _ = evaluate(record.runs, record.design, {"A": "bhyt", "B": "rmsnorm"}, claims=(claim,))
    assert evaluated.tests[0].difference.n == 2 and len(evaluated.tests[0].over_training) == 3
    # shown in the report's tables (and its claim-ready summary in the matched-rate table)
    text = (out / "report.md").read_text()
    best, matched = (text.split(f"## {title}")[1] for title in ("Schemes at their best", "Schemes at matched"))
    assert "| last-layer token RMS |" in best.split("\n\n")[2] and "| ln token RMS growth L/4..L |" in best
    assert "| last-layer token RMS |" in matched.split("\n\n")[2]
    assert "| last-layer token rms |" in compare_table(load_study_runs(out))
    document = json.loads((out / "results.json").read_text())
    assert document["meta"]["schemes"] == ["rmsnorm", "bhyt"]
