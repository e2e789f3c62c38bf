"""``bhyt_pl.variants``: the ``name:key=value`` scheme variants that ``bench --schemes`` and ``study --schemes``
take."""

from __future__ import annotations

import pytest

from bhyt_pl.variants import parse_variant


def test_parse_variant() -> None:
    v = parse_variant("bhyt:impl=fused,lambda_attn=1.0,stat=meanstd")
    assert (v.norm, v.norm_args) == ("bhyt", {"impl": "fused", "lambda_attn": 1.0, "stat": "meanstd"})
    v = parse_variant("bhyt:exact_layers=[0,1],lambda_attn=1.0")  # the list's comma belongs to its value
    assert v.norm_args == {"exact_layers": [0, 1], "lambda_attn": 1.0}
    with pytest.raises(ValueError, match="must be key=value"):
        parse_variant("bhyt:fused")
    with pytest.raises(ValueError, match="impl must be one of"):
        parse_variant("bhyt:impl=fast")
