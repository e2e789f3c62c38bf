"""``python -m bhyt_pl bench``: the command runs, the JSON has its fields, ratios are quotients of medians.

No timing assertions: only behaviour (tiny preset, 2 repetitions, eager only).
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import statistics
import sys

import pytest

from bhyt_pl.bench import main
from bhyt_pl.bench.command import LITGPT, PEER, _settings, parser, run
from bhyt_pl.bench.models import litgpt_available
from bhyt_pl.bench.report import ratio_markdown


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


def test_a_shortened_flag_is_refused_not_read_as_the_flag_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["--repeat", "3"])  # not --repeats
    assert exit_info.value.code == 2 and "unrecognized arguments: --repeat 3" in capsys.readouterr().err


def test_module_entry_point(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["python -m bhyt_pl.bench", "--dry-run", "--quick"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("bhyt_pl.bench", run_name="__main__")
    assert exit_info.value.code == 0
    assert json.loads(capsys.readouterr().out)["preset"] == "tiny"


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
