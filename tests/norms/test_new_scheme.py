"""A norm scheme written and registered in this test file alone gets every shared per-scheme check.

This is the path of a new scheme: its class (here ``ScaledTanhScheme``), its float64 reference
(``REFERENCE``) and a test class that inherits ``SchemeChecks``. The ``case`` fixture registers the scheme
for the test and undoes the registration afterwards, so no other test sees it; every check of
``tests/scheme_checks.py`` (float64 reference, KV cache, meta-device init, state dict, bf16 autocast, hparams,
optimizer groups, a training step), and any check added there later, runs on it without an edit here. A
scheme in ``bhyt_pl/norms/`` needs not even the test class: ``tests/norms/test_schemes.py`` runs the same
checks over the registry and finds its reference in ``tests/norms/test_<module>.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from reference_model import Case, SchemeReference, _p, pre_ln_block
from scheme_checks import SchemeCase, SchemeChecks
from torch import nn

from bhyt_pl.norms import BlockNorms, NormScheme, base, register_norm, registered_norms

NAME = "test_scaled_tanh"


class ScaledTanh(nn.Module):
    """``gamma * tanh(x / (alpha * rms(x)))``: a bounded site with a learnable width ``alpha`` (a scalar)."""

    def __init__(self, dim: int, alpha: float, eps: float) -> None:
        super().__init__()
        self.alpha_init, self.eps = alpha, eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.alpha = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.constant_(self.alpha, self.alpha_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * torch.tanh(x / (self.alpha * rms))


class ScaledTanhScheme(NormScheme):
    """Pre-LN with ``ScaledTanh`` at both sites; the final norm is the default RMSNorm."""

    def __init__(self, alpha: float = 2.0, eps: float = 1e-6) -> None:
        self.alpha, self.eps = alpha, eps
        self._raise_if([f"alpha must be > 0, got {alpha}"] if not alpha > 0 else [])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=ScaledTanh(dim, self.alpha, self.eps), mlp_in=ScaledTanh(dim, self.alpha, self.eps))


def scaled_tanh_ref(x: torch.Tensor, site: nn.Module, eps: float) -> torch.Tensor:
    """The formula in float64, from the site's weights only."""
    return _p(site.weight) * torch.tanh(x / (_p(site.alpha) * torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)))


REFERENCE = SchemeReference(
    block=lambda x, layer, li, model, args, attend: pre_ln_block(
        x, layer, lambda z, site: scaled_tanh_ref(z, site, args.get("eps", 1e-6)), attend
    ),
    cases=(Case({"alpha": 0.5, "eps": 1e-3}), Case(overrides={"qk_norm": "head"})),
)


@pytest.fixture(params=[Case(), *REFERENCE.cases], ids=["defaults", "alpha-eps", "qk_norm"])
def case(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[SchemeCase]:
    """``test_scaled_tanh`` registered for one test, then unregistered (the registry is restored)."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register_norm(NAME)(ScaledTanhScheme)
    c: Case = request.param
    yield SchemeCase(NAME, c.args, c.overrides, REFERENCE, reference_home=__file__)


@pytest.fixture
def scheme(monkeypatch: pytest.MonkeyPatch) -> SchemeCase:
    """``test_scaled_tanh`` at its defaults, registered for one test."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register_norm(NAME)(ScaledTanhScheme)
    return SchemeCase(NAME, reference=REFERENCE, reference_home=__file__)


class TestASchemeDefinedInThisFile(SchemeChecks):
    """Every shared per-scheme check, on ``test_scaled_tanh``."""


def test_the_registration_is_undone() -> None:
    assert NAME not in registered_norms()


def test_a_scheme_without_a_reference_fails_loudly_naming_where_to_add_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register_norm(NAME)(ScaledTanhScheme)
    unreferenced = SchemeCase(NAME, reference_home="tests/norms/test_scaled_tanh.py")
    message = r"'test_scaled_tanh' has no float64 reference: add REFERENCES\['test_scaled_tanh'\] = SchemeReference"
    with pytest.raises(pytest.fail.Exception, match=message + r"\(...\) to tests/norms/test_scaled_tanh.py"):
        SchemeChecks().test_matches_float64_reference(unreferenced)


def test_the_float64_check_sees_a_wrong_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard: a reference that leaves out ``alpha`` fails, so the check above compares something."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register_norm(NAME)(ScaledTanhScheme)
    wrong = SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(
            x,
            layer,
            lambda z, site: _p(site.weight) * torch.tanh(z / torch.sqrt(z.pow(2).mean(-1, True) + 1e-6)),
            attend,
        )
    )
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        SchemeChecks().test_matches_float64_reference(SchemeCase(NAME, reference=wrong))
