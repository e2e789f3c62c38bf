"""``python -m bhyt_pl bench``: the command runs, the JSON has its fields, ratios are quotients of medians.

No timing assertions: only behaviour (tiny preset, 2 repetitions, eager only).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import runpy
import statistics
import sys

import pytest
import torch

from bhyt_pl.bench import gpu, main
from bhyt_pl.bench.command import LITGPT, PEER, _settings, parser, run
from bhyt_pl.bench.decode import parse_size
from bhyt_pl.bench.memory import measure_step_peak, saved_activation_bytes
from bhyt_pl.bench.models import build_model, litgpt_available, litgpt_peer
from bhyt_pl.bench.report import ratio_markdown
from bhyt_pl.bench.timing import interleaved, paired_ratio
from bhyt_pl.variants import parse_variant


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        rc = main(
            [
                "--quick",
                "--no-compile",
                "--parts",
                "sites,train,generate,memory",
                "--schemes",
                "bhyt",
                "bhyt:impl=fused",
                "bhyt:impl=reference",
                "dyt",
                "rmsnorm:impl=reference",
                "--json",
                str(out),
            ]
        )
    assert rc == 0
    return json.loads(out.read_text()), buffer.getvalue()


def test_json_has_machine_settings_and_every_scheme(quick_run) -> None:
    results, _ = quick_run
    assert {"cpu", "torch_threads", "torch", "device"} <= set(results["machine"])
    settings = results["settings"]
    assert settings["schemes"] == [
        "rmsnorm",
        "bhyt",
        "bhyt:impl=fused",
        "bhyt:impl=reference",
        "dyt",
        "rmsnorm:impl=reference",
    ]
    assert settings["repeats"] == 2 and settings["compile"] is False
    assert set(results["sites"]["d64"]["eager"]) == set(settings["schemes"])
    optional = {LITGPT} if litgpt_available() else set()  # an optional peer, timed when installed
    assert set(results["train_step"]["eager"]) == {*settings["schemes"], PEER, *optional}
    assert set(results["generation"]["eager"]["decode"]) == {*settings["schemes"], PEER}
    for label in settings["schemes"]:
        assert results["memory"][label]["train_step_eager"] > 0
        assert results["memory"][label]["sites_d64_eager"] > 0
    assert "compiled" not in results["train_step"]


def test_ratios_are_quotients_of_medians(quick_run) -> None:
    results, _ = quick_run
    sites = results["sites"]["d64"]["eager"]
    base = statistics.median(sites["rmsnorm"]["samples_s"])
    for entry in sites.values():
        assert len(entry["samples_s"]) == 2
        assert entry["median_s"] == statistics.median(entry["samples_s"])
        assert entry["time_vs_rmsnorm"] == pytest.approx(entry["median_s"] / base)
    train = results["train_step"]["eager"]
    tokens = results["settings"]["batch"] * results["settings"]["seq_len"]
    for entry in train.values():
        assert entry["tokens_per_s"] == pytest.approx(tokens / statistics.median(entry["samples_s"]))
        assert entry["throughput_vs_rmsnorm"] == pytest.approx(train["rmsnorm"]["median_s"] / entry["median_s"])
    decode = results["generation"]["eager"]["decode"]
    prefill = results["generation"]["eager"]["prefill"]
    s = results["settings"]
    for name, entry in decode.items():
        seconds = statistics.median(entry["samples_s"]) - prefill[name]["median_s"]  # generate - prefill
        assert entry["tokens_per_s"] == pytest.approx(s["gen_batch"] * (s["new_tokens"] - 1) / seconds)
    summary = results["summary"]["train eager: bhyt / rmsnorm tokens/s"]
    assert summary["ours"] == pytest.approx(train["bhyt"]["throughput_vs_rmsnorm"])


def test_fused_sites_save_less_than_reference(quick_run) -> None:
    memory = quick_run[0]["memory"]
    # the eager RMSNorm Function (the default) saves the input and rstd only, as BHyT's fused site does
    assert memory["rmsnorm"]["sites_d64_eager"] < memory["rmsnorm:impl=reference"]["sites_d64_eager"]
    assert memory["bhyt:impl=fused"]["sites_d64_eager"] <= memory["rmsnorm:impl=reference"]["sites_d64_eager"]
    # the eager default is the fused path (BHyTSiteFunction): it saves what fused saves, less than the plain ops
    assert memory["bhyt"]["sites_d64_eager"] == memory["bhyt:impl=fused"]["sites_d64_eager"]
    assert memory["bhyt:impl=fused"]["sites_d64_eager"] < memory["bhyt:impl=reference"]["sites_d64_eager"]


def test_sites_roofline_bytes_and_bandwidth(quick_run) -> None:
    results, printed = quick_run
    assert results["bandwidth"]["copy"] > 0 and results["bandwidth"]["datasheet"] is None  # CPU
    sites = results["sites"]["d64"]["eager"]
    tokens, element = results["settings"]["site_tokens"], 4
    assert sites["rmsnorm"]["bytes"] == (5 * 2 + 12) * tokens * 64 * element  # two norm sites + two residual adds
    for entry in sites.values():
        assert entry["fraction_of_copy_bandwidth"] == pytest.approx(
            entry["bytes"] / entry["median_s"] / results["bandwidth"]["copy"]
        )
    assert "Norm-site roofline" in printed


def test_markdown_table_printed(quick_run) -> None:
    _, printed = quick_run
    assert "| scheme |" in printed and "| bhyt:impl=fused |" in printed and f"| {PEER} |" in printed
    assert "interleaved repetitions" in printed


def test_help_and_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--schemes" in capsys.readouterr().out
    assert main(["--dry-run", "--schemes", "bhyt_exact", "--threads", "2"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["schemes"] == ["rmsnorm", "bhyt_exact"] and settings["threads"] == 2


def test_bad_arguments_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--schemes", "batchnorm", "--dry-run"])
    assert "unknown scheme 'batchnorm'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--parts", "sites,flops", "--dry-run"])
    assert "unknown ['flops']" in capsys.readouterr().err


def test_parse_variant() -> None:
    v = parse_variant("bhyt:impl=fused,lambda_attn=1.0,stat=meanstd")
    assert (v.norm, v.norm_args) == ("bhyt", {"impl": "fused", "lambda_attn": 1.0, "stat": "meanstd"})
    v = parse_variant("bhyt:exact_layers=[0,1],lambda_attn=1.0")  # the list's comma belongs to its value
    assert v.norm_args == {"exact_layers": [0, 1], "lambda_attn": 1.0}
    with pytest.raises(ValueError, match="must be key=value"):
        parse_variant("bhyt:fused")
    with pytest.raises(ValueError, match="impl must be one of"):
        parse_variant("bhyt:impl=fast")


def test_interleaved_rotates_the_order() -> None:
    calls: list[str] = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    samples = interleaved(fns, repeats=3, warmup=1)
    assert {n: len(s) for n, s in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # after one warm-up round
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        interleaved(fns, repeats=0)


def test_saved_activation_bytes_counts_storages_once_and_skips_parameters() -> None:
    w = torch.nn.Parameter(torch.ones(16))
    x = torch.randn(4, 16, requires_grad=True)
    assert saved_activation_bytes(lambda: torch.exp(x), []) == x.nbytes  # exp saves its output
    assert saved_activation_bytes(lambda: x * x, []) == x.nbytes  # one storage, saved twice
    assert saved_activation_bytes(lambda: x * w, [w]) == x.nbytes  # the parameter is not counted


def test_module_entry_point(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["python -m bhyt_pl.bench", "--dry-run", "--quick"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("bhyt_pl.bench", run_name="__main__")
    assert exit_info.value.code == 0
    assert json.loads(capsys.readouterr().out)["preset"] == "tiny"


def test_gpu_script_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu.main(["--dry-run"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["device"] == "cuda" and settings["dtype"] == "bfloat16" and settings["preset"] == "llama-374m"
    assert settings["compile"] is True


@pytest.mark.parametrize(
    "scheme", ["post_ln", "mix_ln", "derf", "seednorm", "dyisru", "reordered", "hybridnorm", "ssnorm", "gpas", "ngpt"]
)
def test_site_step_runs_every_new_scheme(scheme: str) -> None:
    """The sites benchmark drives Post-LN's residual sites too (block 0 of 16: Mix-LN's first layer is Post-LN)."""
    from bhyt_pl.bench.sites import block_norms, site_step

    cpu = torch.device("cpu")
    norms = block_norms(parse_variant(scheme), 16, 16, cpu, torch.float32, 64)
    step, forward = site_step(norms, 8, False, cpu, torch.float32, 16)
    step()
    u, v, y = forward()
    assert u.shape == v.shape == y.shape == (8, 16)
    if scheme in ("post_ln", "mix_ln"):  # the block output is normalised: unit RMS per token
        torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(8), atol=1e-4, rtol=1e-4)
    if scheme == "hybridnorm":  # the MLP reads the normalised stream after the attention add, no norm of its own
        torch.testing.assert_close(v.pow(2).mean(-1), torch.ones(8), atol=1e-4, rtol=1e-4)
    assert all(p.grad is None for p in norms.parameters())  # the step clears what it accumulated


def test_chunked_loss_saves_no_full_logits_for_backward() -> None:
    """What backward keeps is what the step's peak memory grows by: counted exactly with saved-tensor hooks
    (in-process RSS is too noisy for a test; the bench measures RSS with each side in its own process).
    At a vocabulary of 32768 the plain loss keeps 256 x 32768 float32 logits (32 MiB); the chunked loss
    keeps the hidden states and recomputes one chunk of 32 tokens at a time in backward."""
    from bhyt_pl import Llama, LlamaConfig

    overrides = {"n_layers": 1, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "mlp_dim": 32, "vocab_size": 32768}
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", **overrides))
    idx = torch.randint(0, 32768, (1, 256))
    labels = torch.randint(0, 32768, (1, 256))

    def saved_bytes(impl: str) -> tuple[int, float]:
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        model.loss_impl, model.loss_chunk_tokens = impl, 32
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}  # held anyway, not step memory
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(idx, labels=labels).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return sum(n for ptr, n in storages.items() if ptr not in params), loss.item()

    chunked, chunked_loss = saved_bytes("chunked")
    plain, plain_loss = saved_bytes("plain")
    assert chunked_loss == pytest.approx(plain_loss, rel=1e-5)
    logits_bytes = 256 * 32768 * 4
    assert plain >= logits_bytes
    assert chunked < logits_bytes / 8
    # the bench's own measurement of one side runs and computes the same loss (its RSS figures are the bench's)
    spec = {"preset": "tiny", "overrides": overrides, "batch": 1, "seq_len": 256, "dtype": "float32",
            "device": "cpu", "threads": 1, "loss_chunk_tokens": 32, "side": "chunked"}  # fmt: skip
    measured = measure_step_peak(spec)
    assert measured["peak_growth_bytes"] > 0 and math.isfinite(measured["loss"])


def test_litgpt_peer_computes_our_logits() -> None:
    pytest.importorskip("litgpt")
    model = build_model("tiny", parse_variant("rmsnorm"), {"n_layers": 2}, torch.device("cpu"), torch.float32, 64)
    peer = litgpt_peer(model)
    idx = torch.randint(0, 8192, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(peer(idx), model(idx), atol=1e-5, rtol=1e-5)
    assert peer.lm_head.weight is peer.transformer.wte.weight


def test_paired_ratio_is_the_median_of_per_repetition_ratios_with_order_statistic_bounds() -> None:
    num = [2.0, 3.0, 5.0, 4.0, 6.0, 1.0, 9.0, 8.0, 7.0, 10.0, 11.0]  # ratios to 1.0: 1 .. 11
    r = paired_ratio(num, [1.0] * 11)
    # n = 11: P(Bin(11, 1/2) <= 1) = 12/2048, so [r_(2), r_(10)] covers 1 - 24/2048; [r_(3), r_(9)] only 0.935
    assert (r["median"], r["low"], r["high"], r["n"]) == (6.0, 2.0, 10.0, 11)
    assert r["coverage"] == pytest.approx(1 - 24 / 2048)
    assert paired_ratio([1.0, 2.0], [2.0, 2.0])["median"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="paired samples"):
        paired_ratio([1.0], [1.0, 2.0])


def test_prenorm_train_ratio_and_decode_parts(tmp_path) -> None:
    """The three ratio parts at quick sizes, eager only: structure, ratios from the samples, the profile."""
    args = ["--quick", "--no-compile", "--parts", "prenorm,train_ratio,decode", "--schemes", "rmsnorm", "bhyt"]
    settings = _settings(parser().parse_args([*args, "--decode-sizes", "tiny:1", "--json", str(tmp_path / "r.json")]))
    results = run(settings)
    pre = results["prenorm"]["d64"]
    assert set(pre["median_ms"]) == {"rmsnorm", "bhyt"}  # saving the tanh is a variant of its own, asked for
    s = pre["samples_s"]
    expected = statistics.median(a / b for a, b in zip(s["bhyt"], s["rmsnorm"]))
    assert pre["time_vs_rmsnorm"]["bhyt"]["median"] == pytest.approx(expected)
    tr = results["train_ratio"]
    assert set(tr["tokens_per_s"]) == {"eager/rmsnorm", "eager/bhyt"}
    assert set(tr["ratios"]) == {"eager: bhyt / rmsnorm tokens/s"}
    dec = results["decode"]["tiny:1"]
    assert dec["overrides"] == {"n_layers": 1} and set(dec["median_ms"]) == {"eager/rmsnorm", PEER}
    prof = dec["profile"]["eager/rmsnorm"]
    assert prof["matmul_s"] > 0 and sum(prof[f"{k}_fraction"] for k in ("matmul", "attention", "other")) == (
        pytest.approx(1.0)
    )
    assert "Whole generate call, tiny:1" in ratio_markdown(results)
    with pytest.raises(ValueError, match="preset:n_layers"):
        parse_size("small:two")
