"""``bhyt_pl.bench.report``: entries are medians and quotients of medians, and the markdown shows them."""

from __future__ import annotations

import pytest

from bhyt_pl.bench.report import markdown, throughput_entries, time_entries


def test_time_entries_are_medians_over_the_baselines_median() -> None:
    entries = time_entries({"rmsnorm": [2.0, 4.0, 3.0], "bhyt": [1.0, 9.0, 1.5]})
    assert entries["rmsnorm"]["median_s"] == 3.0 and entries["bhyt"]["median_s"] == 1.5
    assert entries["bhyt"]["time_vs_rmsnorm"] == pytest.approx(0.5) and entries["rmsnorm"]["time_vs_rmsnorm"] == 1.0
    assert entries["bhyt"]["samples_s"] == [1.0, 9.0, 1.5]
    assert time_entries({"bhyt": [1.0]})["bhyt"]["time_vs_rmsnorm"] is None  # no baseline, no ratio


def test_throughput_entries_are_tokens_over_seconds_and_their_ratio() -> None:
    entries = throughput_entries({"rmsnorm": 2.0, "bhyt": 2.5}, tokens=1000, samples={"rmsnorm": [2.0], "bhyt": [2.5]})
    assert entries["rmsnorm"]["tokens_per_s"] == 500.0 and entries["bhyt"]["tokens_per_s"] == 400.0
    assert entries["bhyt"]["throughput_vs_rmsnorm"] == pytest.approx(0.8)  # above 1 would be faster
    assert entries["bhyt"]["samples_s"] == [2.5]
    assert throughput_entries({"dyt": 1.0}, 10)["dyt"] == {
        "median_s": 1.0,
        "tokens_per_s": 10.0,
        "throughput_vs_rmsnorm": None,
    }


SETTINGS = {
    "preset": "tiny",
    "device": "cpu",
    "dtype": "float32",
    "threads": 1,
    "batch": 2,
    "seq_len": 8,
    "site_dims": [16],
    "site_tokens": 32,
    "gen_batch": 1,
    "prompt_len": 4,
    "new_tokens": 4,
    "repeats": 3,
    "schemes": ["rmsnorm", "bhyt"],
}


def test_markdown_has_a_row_per_scheme_with_its_figures_and_the_summary() -> None:
    results = {
        "settings": SETTINGS,
        "train_step": {"eager": throughput_entries({"rmsnorm": 2.0, "bhyt": 2.5, "hf_transformers": 4.0}, 1000)},
        "memory": {"bhyt": {"train_step_eager": 3 * 2**20}},
        "summary": {"train eager: bhyt / rmsnorm tokens/s": {"ours": 0.8, "paper": None}},
    }
    text = markdown(results)
    lines = text.splitlines()
    assert "| scheme | train eager tok/s (x rms) | train_step_eager MiB |" in lines
    assert "| rmsnorm | 500 (1.00) | - |" in lines
    assert "| bhyt | 400 (0.80) | 3.0 |" in lines
    assert "| hf_transformers | 250 (0.50) | - |" in lines  # peers get rows after the schemes
    assert "| train eager: bhyt / rmsnorm tokens/s | 0.800 | - |" in lines
    assert "preset `tiny`, cpu float32, 1 thread(s)" in text
