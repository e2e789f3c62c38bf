"""StabilityMonitor against independent references: explicit softmax entropies, torch.autograd gradients,
numpy moments, a hand-made spike series, a checkpoint round trip."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer
from reference_model import rms, rope_ref
from test_depth_stats import MemoryLogger, hand_set_lm

from bhyt_pl.callbacks import SpikeDetector, StabilityMonitor
from bhyt_pl.callbacks.attention_entropy import _lse_and_key_average_chunked, causal_attention_entropy
from bhyt_pl.callbacks.stability import token_excess_kurtosis, token_max_over_median
from bhyt_pl.module import LlamaLM


def explicit_entropy(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """-sum p log p of the causal softmax of scores computed in full, float64; q [B, H, T, hd], k [B, K, T, hd]."""
    q, k = q.double(), k.double()
    k = torch.stack([k[:, h // (q.shape[1] // k.shape[1])] for h in range(q.shape[1])], dim=1)
    T = q.shape[-2]
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)  # [B, H, T]


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_entropy_equals_softmax_of_explicit_scores(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    q, k = 3.0 * torch.randn(2, 4, 37, 8, generator=g), 3.0 * torch.randn(2, 2, 37, 8, generator=g)  # peaked
    if path == "chunked":
        monkeypatch.setattr(
            "bhyt_pl.callbacks.attention_entropy._lse_and_key_average",
            lambda q, k, scale: _lse_and_key_average_chunked(q, k, scale, chunk=8),
        )
    expected = explicit_entropy(q, k)
    assert 0.1 < expected.mean() < 0.8 * math.log(37)  # neither uniform nor one-hot: a discriminating case
    torch.testing.assert_close(causal_attention_entropy(q, k).double(), expected, atol=2e-4, rtol=1e-4)
    if path == "fused":
        from bhyt_pl.callbacks.attention_entropy import _FUSED_OK

        assert _FUSED_OK["cpu"]  # the CPU kernel that returns the log-sum-exp was used


def test_kurtosis_and_max_over_median_equal_numpy() -> None:
    g = torch.Generator().manual_seed(1)
    for d in (16, 17):  # even d: numpy's median averages the two middle values
        y = torch.randn(3, 5, d, generator=g) ** 3  # heavy tails
        a = y.double().numpy()
        centred = a - a.mean(-1, keepdims=True)
        kurt = (centred**4).mean(-1) / (centred**2).mean(-1) ** 2 - 3
        ratio = np.abs(a).max(-1) / np.median(np.abs(a), axis=-1)
        np.testing.assert_allclose(token_excess_kurtosis(y).numpy(), kurt, rtol=1e-4)
        np.testing.assert_allclose(token_max_over_median(y).numpy(), ratio, rtol=1e-5)


def test_spike_counter_finds_the_known_spikes() -> None:
    rng = np.random.default_rng(0)
    series = list(3.0 + 0.01 * rng.standard_normal(300))
    spikes = {150, 200, 201, 260}
    for i in spikes:
        series[i] += 1.0  # 100 sigma
    series[280] = float("nan")  # a non-finite loss is a spike
    detector = SpikeDetector(window=128, sigma=6.0)
    found = {i for i, v in enumerate(series) if detector.update(v)}
    assert found == spikes | {280}
    assert detector.count == 5
    # an independent rolling computation of the last z-score
    previous = np.array([v for v in series[:-1] if math.isfinite(v)][-128:])
    assert detector.zscore == pytest.approx((series[-1] - previous.mean()) / previous.std(ddof=1), rel=1e-9)
    early = SpikeDetector(window=128, sigma=6.0)
    assert not any(early.update(v) for v in [1.0] * 100 + [50.0])  # fewer than a full window: not counted


def reference_block_values(lm: LlamaLM, ids: torch.Tensor, labels: torch.Tensor) -> dict[str, list[float]]:
    """Per block, from the model's weights: explicit-softmax entropy, numpy moments, autograd gradients."""
    model = lm.model
    x = model.emb_norm(model.embed(ids))
    cos, sin = model.rope(0, ids.shape[1], ids.device, x.dtype)
    out: dict[str, list[float]] = {k: [] for k in ("entropy", "entropy_norm", "kurtosis", "mom", "act_grad")}
    ys = []
    for block in model.layers:
        attn = block.attn
        u = rms(x.double(), block.norms.attn_in.weight, 1e-5)
        B, T, _ = u.shape
        q = (u @ attn.q_proj.weight.double().T).view(B, T, attn.n_head, -1).transpose(1, 2)
        k = (u @ attn.k_proj.weight.double().T).view(B, T, attn.n_kv_head, -1).transpose(1, 2)
        h = explicit_entropy(rope_ref(q, model.config.rope_theta), rope_ref(k, model.config.rope_theta))
        out["entropy"].append(h.mean().item())
        out["entropy_norm"].append((h[..., 1:] / torch.arange(2, T + 1).double().log()).mean().item())
        y = block(x, cos, sin)
        a = y.detach().double().flatten(0, 1).numpy()
        c = a - a.mean(-1, keepdims=True)
        out["kurtosis"].append(((c**4).mean(-1) / (c**2).mean(-1) ** 2 - 3).mean())
        out["mom"].append((np.abs(a).max(-1) / np.median(np.abs(a), axis=-1)).mean())
        ys.append(y)
        x = y
    logits = model.output(model.final_norm(x))
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    params = [list(block.parameters()) for block in model.layers]
    grads = torch.autograd.grad(loss, ys + [p for ps in params for p in ps] + [model.embed.weight])
    for g in grads[: len(ys)]:
        out["act_grad"].append(g.flatten(0, 1).norm(dim=-1).mean().item())
    rest = list(grads[len(ys) :])
    out["grad_norm"] = []
    for ps in params:
        block_grads, rest = rest[: len(ps)], rest[len(ps) :]
        out["grad_norm"].append(torch.sqrt(sum(g.pow(2).sum() for g in block_grads)).item())
    out["embed"] = [rest[0].norm().item()]
    site = model.layers[0].norms.mlp_in.weight
    out["site"] = [
        torch.autograd.grad(F.cross_entropy(model(ids).flatten(0, 1), labels.flatten()), site)[0].norm().item()
    ]
    return out


def test_entropy_reads_the_attentions_softmax_scale() -> None:
    """nGPT's softmax scale is sqrt(hd), not 1/sqrt(hd): the logged entropy of layer 0 is the explicit entropy
    of its L2-normalised, scaled, rotated queries and keys at that scale (computed here from the formulas)."""
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="ngpt", lr=1e-9)
    lm.configure_model()
    model = lm.model
    ids = next(iter(TokenDataModule().train_dataloader()))["input_ids"]
    attn, d = model.layers[0].attn, model.config.dim
    with torch.no_grad():
        u = model.embed.weight.double()[ids]  # nGPT: no embedding norm, no pre-norm
        B, T, _ = u.shape
        q = F.normalize(u @ attn.q_proj.weight.double().T, dim=-1) * attn.sq.double() * math.sqrt(d)
        k = F.normalize(u @ attn.k_proj.weight.double().T, dim=-1) * attn.sk.double() * math.sqrt(d)
        q = q.view(B, T, attn.n_head, -1).transpose(1, 2)
        k = k.view(B, T, attn.n_kv_head, -1).transpose(1, 2)
        theta = model.config.rope_theta
        h = explicit_entropy(rope_ref(q, theta), rope_ref(k, theta), math.sqrt(attn.head_dim)).mean().item()
        wrong = explicit_entropy(rope_ref(q, theta), rope_ref(k, theta)).mean().item()
    assert abs(h - wrong) > 1e-2  # the scale matters here
    logger = MemoryLogger()
    trainer = quiet_trainer(callbacks=[StabilityMonitor(every_n_steps=100, figures=False)], logger=logger, max_steps=1)
    trainer.fit(lm, datamodule=TokenDataModule())
    assert logger.history[1]["stability/attn_entropy/layer_00"] == pytest.approx(h, rel=1e-4)


def test_logged_statistics_equal_independent_references() -> None:
    lm = hand_set_lm("rmsnorm")
    batch = next(iter(TokenDataModule().train_dataloader()))
    expected = reference_block_values(lm, batch["input_ids"], batch["labels"])
    assert expected["entropy_norm"][0] < 0.95  # attention is not uniform here, so the entropy is tested
    logger = MemoryLogger()
    trainer = quiet_trainer(
        callbacks=[StabilityMonitor(every_n_steps=100, figures=False)], logger=logger, max_steps=1,
        gradient_clip_val=1e-3,  # clipping happens after the monitor reads the norms
    )  # fmt: skip
    trainer.fit(lm, datamodule=TokenDataModule())
    logged = logger.history[1]
    for i in range(TINY_OVERRIDES["n_layers"]):
        layer = f"layer_{i:02d}"
        assert logged[f"stability/attn_entropy/{layer}"] == pytest.approx(expected["entropy"][i], rel=1e-4)
        assert logged[f"stability/attn_entropy_normalized/{layer}"] == pytest.approx(
            expected["entropy_norm"][i], rel=1e-4
        )
        assert logged[f"stability/kurtosis/{layer}"] == pytest.approx(expected["kurtosis"][i], rel=1e-4, abs=1e-5)
        assert logged[f"stability/max_over_median/{layer}"] == pytest.approx(expected["mom"][i], rel=1e-5)
        assert logged[f"stability/act_grad_norm/{layer}"] == pytest.approx(expected["act_grad"][i], rel=1e-5)
        assert logged[f"stability/grad_norm/{layer}"] == pytest.approx(expected["grad_norm"][i], rel=1e-5)
    assert logged["stability/grad_norm/embed"] == pytest.approx(expected["embed"][0], rel=1e-5)
    assert logged["stability/grad_norm/mlp_in/layer_00"] == pytest.approx(expected["site"][0], rel=1e-5)
    outside = logged["stability/grad_norm/embed"] ** 2 + logged["stability/grad_norm/final_norm"] ** 2
    total = math.sqrt(sum(v**2 for k, v in logged.items() if k.startswith("stability/grad_norm/layer_")) + outside)
    assert logged["stability/grad_norm_total"] == pytest.approx(total, rel=1e-6)
    assert expected["grad_norm"][0] != pytest.approx(expected["grad_norm"][1], rel=1e-3)  # layers are told apart
    # step 1 has no history: its z-scores were logged as NaN
    assert "stability/loss_zscore" not in logged and "stability/grad_norm_zscore" not in logged
    assert "stability/loss_spikes" in logged


def test_spike_counts_survive_a_checkpoint_round_trip(tmp_path) -> None:
    def run(steps: int, resume: str | None = None) -> StabilityMonitor:
        torch.manual_seed(0)
        lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32, lr=1e-2, warmup_steps=0)
        # a tiny sigma and window make ordinary steps spikes, so the counts are not zero
        monitor = StabilityMonitor(every_n_steps=100, figures=False, spike_window=3, spike_sigma=1e-3,
                                   spike_min_history=2)  # fmt: skip
        checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=1)
        trainer = quiet_trainer(callbacks=[monitor, checkpoint], enable_checkpointing=True, max_steps=steps)
        trainer.fit(lm, datamodule=TokenDataModule(), ckpt_path=resume)
        return monitor

    first = run(6)
    saved = first.state_dict()
    assert saved["loss"]["count"] + saved["grad_norm"]["count"] > 0
    stored = torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"]
    assert any(state == saved for state in stored.values())
    resumed = run(7, resume=str(tmp_path / "last.ckpt"))
    state = resumed.state_dict()
    for name in ("loss", "grad_norm"):
        assert state[name]["count"] >= saved[name]["count"]
        assert state[name]["history"][:-1] == saved[name]["history"][1:]  # the window rolled on by one step


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_two_processes_log_the_statistics_of_one(tmp_path) -> None:
    """Sharded gradient norms are full-tensor norms and sums over ranks give the one-process means."""
    from distributed_jobs.launch import ROOT, run

    from bhyt_pl import Llama, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig.from_name("tiny", **TINY_OVERRIDES, norm="bhyt", norm_args={"seq_len": 32})
    init = tmp_path / "init.ckpt"
    state = {f"model.{k}": v for k, v in Llama(config).state_dict().items()}
    torch.save({"state_dict": state, "bhyt_pl": {"model_config": config.to_dict(), "tokenizer": "embedded"}}, init)
    job = ROOT / "tests" / "distributed_jobs" / "fsdp2_stability.py"
    out = tmp_path / "stats2.json"
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(job), str(init), str(out)])
    two = json.loads(out.read_text())
    sys.path.insert(0, str(job.parent))
    try:
        from fsdp2_stability import train
    finally:
        sys.path.remove(str(job.parent))
    one = json.loads(json.dumps(train(str(init), 1)))  # the same job in this process, keys as JSON has them
    assert sorted(one) == sorted(two) == ["1", "2"]
    for step in one:
        assert sorted(one[step]) == sorted(two[step])
        assert "stability/grad_norm/layer_01" in one[step] and "stability/attn_entropy/layer_00" in one[step]
        for key, value in one[step].items():
            if math.isnan(value):
                assert math.isnan(two[step][key]), key
            else:
                assert two[step][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_logging_steps_run_with_the_force_eager_stance_and_restore_the_previous_one() -> None:
    """Steps 1 and 2 log (every 2, and the first): their forwards see ``force_eager``; step 3 and the
    time after the fit see the stance the user had set (here ``eager_on_recompile``, not the default)."""
    from torch._dynamo import eval_frame

    lm, seen = hand_set_lm("bhyt"), []
    lm.model.register_forward_hook(lambda *args: seen.append(eval_frame._stance.stance))
    monitor = StabilityMonitor(every_n_steps=2, figures=False)
    with torch.compiler.set_stance("eager_on_recompile"):
        quiet_trainer(callbacks=[monitor], logger=MemoryLogger(), max_steps=3, limit_val_batches=0).fit(
            lm, datamodule=TokenDataModule()
        )
        after = eval_frame._stance.stance
    assert seen == ["force_eager", "force_eager", "eager_on_recompile"]
    assert after == "eager_on_recompile"


def test_compiled_blocks_are_measured_like_eager_ones() -> None:
    """Hooks on a compiled block fire and the statistics are computed outside its graph (dynamo traces the
    block; the eager backend skips inductor's code generation, which the hooks never reach)."""
    logged = []
    for compiled in (False, True):
        lm = hand_set_lm("bhyt")
        if compiled:
            for layer in lm.model.layers:
                layer.compile(backend="eager")
        logger = MemoryLogger()
        monitor = StabilityMonitor(every_n_steps=2, figures=False)
        quiet_trainer(callbacks=[monitor], logger=logger, max_steps=3).fit(lm, datamodule=TokenDataModule())
        logged.append(logger.history)
    eager, compiled = logged
    assert sorted(eager) == sorted(compiled) == [1, 2]
    for step in eager:
        assert sorted(eager[step]) == sorted(compiled[step])
        assert "stability/attn_entropy/layer_01" in compiled[step]
        for key, value in eager[step].items():
            if not math.isnan(value):
                assert compiled[step][key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
