"""The weight-init policy, in one place: N(0, std) for every linear and embedding weight (docs/method.md,
section 5), and each norm module's own ``reset_parameters`` for its gains, lambdas and alphas."""

from __future__ import annotations

from torch import nn

__all__ = ["init_weights"]


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Initialise ``module`` and all its submodules in place.

    Works on a model materialised from the meta device (``to_empty``), where every value is garbage.
    """
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif m is not module and callable(getattr(m, "reset_parameters", None)):
            has_own_state = any(True for _ in m.parameters(recurse=False)) or any(
                True for _ in m.buffers(recurse=False)
            )
            if has_own_state:
                m.reset_parameters()
