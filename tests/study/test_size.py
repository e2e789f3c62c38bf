"""The size of a study's runs (``bhyt_pl.study.protocol.size``): its figures and its line against hand computation,
one size per model shape with every candidate's total, and the record's round trip."""

from __future__ import annotations

import json

import pytest

from bhyt_pl.study.protocol.size import RunSize, epochs, run_sizes, unique_tokens
from bhyt_pl.study.protocol.spec import RunSpec


def test_unique_tokens_and_epochs() -> None:
    assert unique_tokens(92_160, 933_888) == 92_160 and epochs(92_160, 933_888) == pytest.approx(0.0986842)
    assert unique_tokens(2_048_000, 933_888) == 933_888 and epochs(2_048_000, 933_888) == pytest.approx(2.1929825)
    assert unique_tokens(5, None) is None and epochs(5, None) is None


def test_the_line_of_the_default_study() -> None:
    size = RunSize(32, 6_291_456, 1_048_576, {"rmsnorm": 7_348_352}, 92_160, 933_888)
    assert size.tokens_per_param == pytest.approx(92_160 / 6_291_456)  # 0.01465
    assert size.text() == (
        "6,291,456 in block matrices (P), 7,348,352 in all, 1,048,576 embedding; tokens per run 92,160 = 0.0146 "
        "tokens per parameter (T/P)"
    )
    # past one pass: 4 x 933,888 tokens seen -> 4 epochs; T/P = 3,735,552 / 6,291,456 = 0.594
    long = RunSize(32, 6_291_456, 1_048_576, {"rmsnorm": 7_348_352, "peri_ln": 7_356_544}, 3_735_552, 933_888)
    assert long.text() == (
        "6,291,456 in block matrices (P), 7,348,352 to 7,356,544 in all (the schemes' norm parameters differ), "
        "1,048,576 embedding; tokens per run 3,735,552 = 0.594 tokens per parameter (T/P); past the training data "
        "(933,888 tokens a pass): 3,735,552 tokens seen, 933,888 unique, 4 epochs"
    )
    assert "epochs" not in RunSize(32, 6_291_456, 1_048_576, {}, 3_735_552, None).text()  # corpus unknown


def test_the_meta_entry_round_trips_through_json() -> None:
    size = RunSize(16, 786_432, 524_288, {"rmsnorm": 1_312_832}, 2_048_000, 933_888)
    data = json.loads(json.dumps(size.to_dict()))
    assert data["tokens_per_param"] == pytest.approx(2_048_000 / 786_432)
    assert (data["unique_tokens"], data["epochs"]) == (933_888, pytest.approx(2_048_000 / 933_888))
    assert RunSize.from_dict(data) == size


def test_one_size_per_shape_with_every_candidates_total() -> None:
    base = RunSpec(label="base", norm="rmsnorm", preset="deep-32x128")
    specs = [
        RunSpec(label=f"{c}-{d}-{lr}", norm=norm, preset="deep-32x128", overrides={"n_layers": d}, candidate=c, lr=lr)
        for d in (2, 4)
        for lr in (1e-3, 1e-2)
        for c, norm in (("rmsnorm", "rmsnorm"), ("peri_ln", "peri_ln"))
    ]
    sizes = run_sizes([base, *specs], 10_240, None)
    # the base (32 layers), then 2 and 4 layers; P = L x 196,608; totals P + 1,048,576 + RMSNorm's L x 256 + 128,
    # Peri-LN's L x 256 more
    assert [(s.n_layers, s.block_params, s.embedding_params) for s in sizes] == [
        (32, 6_291_456, 1_048_576),
        (2, 393_216, 1_048_576),
        (4, 786_432, 1_048_576),
    ]
    assert sizes[0].total_params == {"rmsnorm": 7_348_352}
    assert sizes[1].total_params == {"rmsnorm": 1_442_432, "peri_ln": 1_442_944}
    assert sizes[2].total_params == {"rmsnorm": 1_836_160, "peri_ln": 1_837_184}
    assert all(s.tokens == 10_240 and s.corpus_tokens is None for s in sizes)
