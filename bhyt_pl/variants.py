"""What the bench and the study run: a norm scheme plus constructor arguments, written ``name[:key=value,...]``.

``bhyt:impl=reference`` is the BHyT site in plain autograd ops; ``bhyt`` alone is the default
(``impl=auto``). Values parse as Python literals where they can (``lambda_attn=1.0``), else strings;
commas inside brackets belong to the value (``bhyt:exact_layers=[0,1],lambda_attn=1.0``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from bhyt_pl.norms import build_norm_scheme, registered_norms

__all__ = ["DEFAULT_VARIANTS", "Variant", "parse_variant", "split_options"]

DEFAULT_VARIANTS = (
    "rmsnorm",
    "bhyt",
    "bhyt:impl=reference",
    "bhyt:impl=fused",
    "bhyt_exact",
    "dyt",
    "peri_ln",
    "lns",
    "layernorm",
)


@dataclass(frozen=True)
class Variant:
    label: str
    norm: str
    norm_args: dict[str, Any] = field(default_factory=dict)


def split_options(text: str) -> list[str]:
    """Split ``key=value`` options at commas outside brackets, so a list value can hold commas."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def parse_variant(text: str) -> Variant:
    """``"bhyt:impl=fused,lambda_attn=1.0"`` -> Variant; the scheme is built once to validate it."""
    name, _, rest = text.partition(":")
    if name not in registered_norms():
        raise ValueError(f"unknown scheme {name!r} in {text!r}; registered norms: {', '.join(registered_norms())}")
    args: dict[str, Any] = {}
    for item in filter(None, split_options(rest)):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"scheme option {item!r} in {text!r} must be key=value, e.g. bhyt:impl=fused")
        try:
            args[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            args[key] = value
    build_norm_scheme(name, **args)
    return Variant(text, name, args)
