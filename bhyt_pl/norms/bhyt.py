"""BHyT, Bounded Hyperbolic Tanh (arXiv 2601.09719), and BHyT* with exact statistics.

docs/method.md, sections 2-3. One site computes ``gamma * tanh(lambda * x / D(x))`` where the bound is
``D = kappa * sqrt(m + eps)`` (``stat="rms"``, the released code) or
``D = kappa * sqrt(var + eps) + |mu|`` (``stat="meanstd"``, the paper's ideal form). By Chebyshev
at least a fraction ``p`` of the coordinates satisfy ``|x_i| <= D``, so the tanh argument stays in
``[-lambda, lambda]``.

``bhyt`` makes exactly one reduction per block: site B does not reduce over ``h = x + Attn(u)``
but uses the statistic of ``x`` plus the variance the attention adds,
``c * stopgrad(lambda_A)^2 / kappa^2`` with ``c = ||W_V W_O||_F^2 / (T d)`` cached per layer.
``exact_layers`` (off by default, as in the released code) gives chosen layers exact statistics at
site B instead: the approximation assumes attention uniform over all ``T`` tokens and under-predicts
the moment of ``h`` where the residual stream is still small (the first layers).

Two implementations of a site compute the same function (``impl``): ``reference`` is the formula in
plain autograd ops (it saves the tanh output for backward); ``fused`` saves only the site input and
per-token scalars and recomputes the tanh in backward. ``auto`` (the default) is ``fused`` on CPU and
while compiling, and ``reference`` in eager mode on CUDA and other devices: the eager Function was
measured on CPU only, and on CUDA it runs as one block with several activation-sized float32
temporaries. The fused paths' autograd Functions live in ``bhyt_pl.norms.bhyt_kernels``: eager,
``BHyTSiteFunction`` (one Function per site with the statistic inside); while ``torch.compile`` traces,
``CompiledSiteFunction`` and ``SecondMomentFunction``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.bhyt_kernels import BHyTSiteFunction, CompiledSiteFunction, SecondMomentFunction
from bhyt_pl.norms.rmsnorm import IMPLS, RMSNorm
from bhyt_pl.tensors import full_tensor

__all__ = [
    "IMPLS",
    "BHyT",
    "BHyTBlockNorms",
    "BHyTExactScheme",
    "BHyTScheme",
    "UNBOUND_SEQ_LEN",
    "SiteStats",
    "satisfies_variance_bound",
    "vo_constant",
]

STATS = ("rms", "meanstd")

UNBOUND_SEQ_LEN = 1024
"""``T`` of a ``bhyt`` scheme whose ``seq_len`` no run has bound: the paper's pretraining length."""

MOMENT_RATIO_FIRST_POSITIONS = 8
"""``bhyt_moment_ratio_first8`` covers sequence positions ``0 .. MOMENT_RATIO_FIRST_POSITIONS - 1``."""


class SiteStats(NamedTuple):
    """Per-token statistics of a site input, float32, shape [..., 1].

    ``spread`` is the uncentered second moment ``m`` for ``stat="rms"`` and the variance for
    ``stat="meanstd"``; ``mean`` is None for ``rms``. The site-B correction adds to ``spread``.
    """

    mean: torch.Tensor | None
    spread: torch.Tensor


def satisfies_variance_bound(lam: float, kappa: float, n_layers: int) -> bool:
    """The paper's condition ``lambda / kappa < 1 / sqrt(L)`` under which BHyT's per-layer output
    variance bound is below LayerNorm Scaling's."""
    return lam / kappa < 1.0 / math.sqrt(n_layers)


def vo_constant(w_v: torch.Tensor, w_o: torch.Tensor, n_head: int, n_kv_head: int, seq_len: int) -> torch.Tensor:
    """``c = ||W_V W_O||_F^2 / (T d)`` with the GQA expansion (docs/method.md, section 3).

    Args:
        w_v: value projection weight, ``nn.Linear`` layout [n_kv_head * head_dim, d].
        w_o: output projection weight, [d, n_head * head_dim].
        n_head, n_kv_head: query and key/value heads; each KV head's rows repeat over its group.
        seq_len: ``T``, the training sequence length.

    Returns:
        A scalar tensor, float32 or wider.
    """
    d = w_v.shape[1]
    head_dim = w_v.shape[0] // n_kv_head
    dtype = torch.promote_types(w_v.dtype, torch.float32)
    wv = w_v.to(dtype).view(n_kv_head, head_dim, d)  # [kv, hd, d]
    wv = wv.repeat_interleave(n_head // n_kv_head, dim=0).reshape(n_head * head_dim, d)  # [H*hd, d], as attention
    product = w_o.to(dtype) @ wv  # [d, d]: the linear map x -> o_proj(v_proj(x)) per attended token
    return product.pow(2).sum() / (seq_len * d)


class BHyT(nn.Module):
    """One BHyT site: ``gamma * tanh(lambda * x / D)``.

    Args:
        dim: hidden size ``d``.
        lambda_init: initial ``lambda`` (bound of the tanh argument).
        kappa: Chebyshev width ``1/sqrt(1-p)``.
        eps: added to the second moment (or variance) inside the square root.
        learnable_lambda: a parameter if True, else a fixed buffer that never trains.
        stat: ``rms`` or ``meanstd`` (see module docstring).
        impl: ``reference`` (plain ops), ``fused`` (``BHyTSiteFunction`` eager, the traced Functions while
            compiling) or ``auto`` (``fused`` while compiling and on CPU; eager on other devices,
            ``reference``; see the module docstring).
        save_tanh: the eager ``BHyTSiteFunction`` saves its tanh for backward (one more activation-sized
            tensor per site) instead of recomputing it from the saved input (docs/performance.md).
    """

    def __init__(
        self,
        dim: int,
        lambda_init: float,
        kappa: float,
        eps: float,
        learnable_lambda: bool = True,
        stat: str = "rms",
        impl: str = "auto",
        save_tanh: bool = False,
    ) -> None:
        super().__init__()
        if stat not in STATS:
            raise ValueError(f"stat must be one of {', '.join(STATS)}; got {stat!r}")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
        self.dim, self.lambda_init, self.kappa, self.eps, self.stat = dim, lambda_init, kappa, eps, stat
        self.impl, self.save_tanh = impl, save_tanh
        self.weight = nn.Parameter(torch.empty(dim))
        if learnable_lambda:
            self.lambda_ = nn.Parameter(torch.empty(1))  # 1-element, not 0-d: FSDP2 shards no scalars
        else:  # a buffer, so "fixed" really is fixed (a Parameter would reset requires_grad)
            self.register_buffer("lambda_", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        with torch.no_grad():
            self.lambda_.fill_(self.lambda_init)

    def fused(self) -> bool:
        """Whether this call takes a fused path: ``fused`` always, ``reference`` never, ``auto`` while compiling
        and for parameters on the CPU (the only device ``BHyTSiteFunction`` was measured on)."""
        if self.impl == "auto":
            return torch.compiler.is_compiling() or self.weight.device.type == "cpu"
        return self.impl == "fused"

    def eager_function(self) -> bool:
        """Whether this call runs ``BHyTSiteFunction`` (a fused path outside ``torch.compile``)."""
        return self.fused() and not torch.compiler.is_compiling()

    def _function(self, x: torch.Tensor, stats: SiteStats | None):
        mean, spread = (None, None) if stats is None else stats
        return BHyTSiteFunction.apply(
            x, mean, spread, self.lambda_, self.weight, self.eps, self.kappa, self.stat, self.save_tanh
        )

    def statistics(self, x: torch.Tensor) -> SiteStats:
        """Exact per-token statistics of ``x`` over the hidden dim, at least float32."""
        if self.stat == "rms" and self.fused():
            return SiteStats(None, SecondMomentFunction.apply(x))
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        if self.stat == "rms":
            return SiteStats(None, xf.pow(2).mean(dim=-1, keepdim=True))
        var, mean = torch.var_mean(xf, dim=-1, keepdim=True, correction=0)
        return SiteStats(mean, var)

    def inverse_bound(self, stats: SiteStats) -> torch.Tensor:
        """``1 / D``: ``rsqrt(m + eps) / kappa`` or ``1 / (kappa * sqrt(var + eps) + |mu|)``."""
        if stats.mean is None:
            return torch.rsqrt(stats.spread + self.eps) / self.kappa
        return 1.0 / (self.kappa * torch.sqrt(stats.spread + self.eps) + stats.mean.abs())

    def preactivation(self, x: torch.Tensor, stats: SiteStats | None = None) -> torch.Tensor:
        """The tanh argument ``lambda * x / D`` in float32; exact statistics when ``stats`` is None."""
        if stats is None:
            stats = self.statistics(x)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        return (self.lambda_ * self.inverse_bound(stats)) * xf

    def scalars(self) -> dict[str, torch.Tensor]:
        """``{"lambda": lambda}`` for diagnostics (the ``BoundedSite`` interface)."""
        return {"lambda": self.lambda_}

    def forward(
        self, x: torch.Tensor, stats: SiteStats | None = None, return_stats: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, SiteStats]:
        """The site's output; with ``return_stats`` (exact statistics only) also ``statistics(x)``, the
        statistic site B reuses, which the eager Function computes in the same pass."""
        if return_stats:
            if stats is not None:
                raise ValueError("return_stats computes exact statistics; pass stats=None")
            if self.eager_function():
                out = self._function(x, None)
                return out[0], SiteStats(out[2] if self.stat == "meanstd" else None, out[1])
            stats = self.statistics(x)
            return self.forward(x, stats), stats
        if self.eager_function():
            out = self._function(x, stats)
            return out if stats is not None else out[0]
        if not self.fused():
            return (self.weight * torch.tanh(self.preactivation(x, stats))).to(x.dtype)
        if stats is None:
            stats = self.statistics(x)
        scale = self.lambda_ * self.inverse_bound(stats)  # [..., 1], float32: lambda / D per token
        return CompiledSiteFunction.apply(x, scale, self.weight)

    def extra_repr(self) -> str:
        learn = isinstance(self.lambda_, nn.Parameter)
        return (
            f"{self.dim}, lambda_init={self.lambda_init}, kappa={self.kappa:.4g}, stat={self.stat}, "
            f"learnable={learn}, impl={self.impl}"
        )


class BHyTBlockNorms(BlockNorms):
    """BHyT's two sites of one block; site B reuses site A's statistic when ``approximate``.

    ``c`` is a non-persistent buffer, outside the state dict: ``refresh_constants`` recomputes it from the
    current weights (after init, after a load, on the refresh schedule during training), and ``constants`` /
    ``set_constants`` carry the value in use through a training checkpoint (``NormConstantRefresh``).
    """

    def __init__(self, attn_in: BHyT, mlp_in: BHyT, approximate: bool, seq_len: int) -> None:
        super().__init__(attn_in=attn_in, mlp_in=mlp_in)
        self.approximate, self.seq_len = approximate, seq_len
        self.register_buffer("c", torch.zeros((), dtype=torch.float32), persistent=False)

    def pre_attn(self, x: torch.Tensor) -> tuple[torch.Tensor, SiteStats]:
        return self.attn_in(x, return_stats=True)  # the block's one reduction (site A), through the hooks

    def approximate_stats(self, stats: SiteStats) -> SiteStats:
        """Site B's statistic of ``h = x + Attn(u)`` from site A's: ``m + c * sg(lambda_A)^2 / kappa^2``."""
        kappa = self.attn_in.kappa
        correction = self.c * self.attn_in.lambda_.detach() ** 2 / kappa**2  # no grad to lambda_A or to W_V, W_O
        return SiteStats(stats.mean, stats.spread + correction)

    def pre_mlp(self, h: torch.Tensor, ctx: SiteStats) -> torch.Tensor:
        if not self.approximate:  # BHyT*: a second, exact reduction over h
            return self.mlp_in(h)
        return self.mlp_in(h, self.approximate_stats(ctx))  # site B: no reduction over h (docs/method.md, section 3)

    def site_statistics(
        self, site: str, args: tuple[Any, ...], saturation_threshold: float = 2.0
    ) -> dict[str, tuple[torch.Tensor, float | torch.Tensor]]:
        """``BlockNorms.site_statistics`` plus, at an approximated site B, the moment ratios: the statistic
        the forward received (``approximate_stats`` of site A's) against the exact one over ``h``
        (docs/method.md, section 3). ``bhyt_moment_ratio``: approximated over exact second moment per
        token; ``bhyt_moment_ratio_of_means``: mean approximated over mean exact moment (dominated by the
        large tokens); ``bhyt_moment_ratio_first8`` / ``bhyt_moment_ratio_rest``: the per-token ratio over
        positions ``0 .. MOMENT_RATIO_FIRST_POSITIONS - 1`` and after (causal attention averages early
        queries over few keys)."""
        out = super().site_statistics(site, args, saturation_threshold)
        if site != "mlp_in" or not self.approximate or len(args) < 2 or not isinstance(args[1], SiteStats):
            return out
        n = args[0].flatten(0, -2).shape[0]  # tokens
        exact = self.mlp_in.statistics(args[0]).spread  # [B, T, 1]
        approx = args[1].spread.expand_as(exact)  # [B, T, 1]
        ratio = approx / exact.clamp_min(1e-30)  # [B, T, 1]
        out["bhyt_moment_ratio"] = (ratio.sum(), n)
        out["bhyt_moment_ratio_of_means"] = (approx.sum(), exact.sum())
        early = ratio[..., :MOMENT_RATIO_FIRST_POSITIONS, :]  # few visible keys
        out["bhyt_moment_ratio_first8"] = (early.sum(), early.numel())
        if ratio.shape[-2] > MOMENT_RATIO_FIRST_POSITIONS:
            late = ratio[..., MOMENT_RATIO_FIRST_POSITIONS:, :]
            out["bhyt_moment_ratio_rest"] = (late.sum(), late.numel())
        return out

    @torch.no_grad()
    def refresh_constants(self, attn: nn.Module) -> None:
        if not self.approximate:
            return
        w_v, w_o = full_tensor(attn.v_proj.weight), full_tensor(attn.o_proj.weight)
        if w_v.shape != (attn.n_kv_head * attn.head_dim, w_o.shape[0]) or w_o.ndim != 2:
            # FSDP1 outside ``summon_full_params``: the weights are flat views of a local shard, from
            # which c cannot be computed; NormConstantRefresh recomputes it inside summon_full_params
            return
        self.c.copy_(vo_constant(w_v, w_o, attn.n_head, attn.n_kv_head, self.seq_len))

    def constants(self) -> dict[str, torch.Tensor]:
        return {"c": self.c}

    @torch.no_grad()
    def set_constants(self, constants: Mapping[str, torch.Tensor]) -> None:
        if set(constants) != {"c"}:
            raise ValueError(f"BHyT block norms cache exactly one constant, 'c'; got {sorted(constants)}")
        self.c.copy_(constants["c"])


def _exact_layers(value: int | list[int] | tuple[int, ...] | None) -> int | tuple[int, ...] | None:
    """``exact_layers`` as stored: None, an int ``k`` (the first k layers) or a sorted tuple of indices
    (a tuple, so that schemes stay hashable and compare equal however the list was written)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        if isinstance(value, int) and value < 0:
            raise ValueError(f"invalid 'bhyt' norm configuration: exact_layers must be >= 0, got {value}")
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        if any(i < 0 for i in value):
            raise ValueError(f"invalid 'bhyt' norm configuration: exact_layers indices must be >= 0, got {list(value)}")
        return tuple(sorted(set(value)))
    raise TypeError(
        "invalid 'bhyt' norm configuration: exact_layers must be None, an int k (the first k layers) or a list "
        f"of layer indices such as [0, 1]; got {value!r}"
    )


class _BHyTSchemeBase(NormScheme):
    approximate: bool

    def __init__(
        self,
        lambda_attn: float = 2.0,
        lambda_mlp: float = 1.0,
        lambda_final: float = 0.0,
        learnable_lambda: bool = True,
        p: float = 0.99,
        kappa: float | None = None,
        stat: str = "rms",
        eps: float = 1e-6,
        final_eps: float = 1e-5,
        impl: str = "auto",
        save_tanh: bool = False,
    ) -> None:
        self.lambda_attn, self.lambda_mlp, self.lambda_final = lambda_attn, lambda_mlp, lambda_final
        self.learnable_lambda, self.p, self.kappa, self.stat = learnable_lambda, p, kappa, stat
        self.eps, self.final_eps, self.impl, self.save_tanh = eps, final_eps, impl, save_tanh
        problems = []
        for n, v in (("lambda_attn", lambda_attn), ("lambda_mlp", lambda_mlp)):
            if not v > 0:
                problems.append(f"{n} must be > 0, got {v}")
        if not lambda_final >= 0:
            problems.append(f"lambda_final must be >= 0 (0 selects an RMSNorm final norm), got {lambda_final}")
        if kappa is None and not 0 < p < 1:
            problems.append(f"p must be in (0, 1) (kappa = 1/sqrt(1-p)), got {p}")
        if kappa is not None and not kappa > 0:
            problems.append(f"kappa must be > 0 (or None to derive it from p), got {kappa}")
        if stat not in STATS:
            problems.append(f"stat must be one of {', '.join(STATS)}; got {stat!r}")
        if not eps > 0:
            problems.append(f"eps must be > 0, got {eps}")
        if not final_eps > 0:
            problems.append(f"final_eps must be > 0, got {final_eps}")
        if impl not in IMPLS:
            problems.append(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
        if not isinstance(save_tanh, bool):
            problems.append(f"save_tanh must be true or false, got {save_tanh!r}")
        self._raise_if(problems)

    @property
    def kappa_value(self) -> float:
        """``kappa``, or ``1/sqrt(1-p)`` when not given (p = 0.99 gives 10)."""
        return float(self.kappa) if self.kappa is not None else 1.0 / math.sqrt(1.0 - self.p)

    def _site(self, dim: int, lambda_init: float) -> BHyT:
        return BHyT(
            dim, lambda_init, self.kappa_value, self.eps, self.learnable_lambda, self.stat, self.impl, self.save_tanh
        )

    def _seq_len(self) -> int:
        return 1  # unused by the exact scheme

    def approximates(self, layer_idx: int, n_layers: int) -> bool:
        """Whether site B of layer ``layer_idx`` uses the approximated statistic (False: exact)."""
        return self.approximate

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        approximate = self.approximates(layer_idx, n_layers)
        return BHyTBlockNorms(
            self._site(dim, self.lambda_attn), self._site(dim, self.lambda_mlp), approximate, self._seq_len()
        )

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        if self.lambda_final == 0:  # the released pretraining default
            return RMSNorm(dim, self.final_eps)
        return self._site(dim, self.lambda_final)  # exact statistics

    def variance_bound_report(self, n_layers: int) -> dict[str, bool]:
        """Whether each site's initial lambda satisfies ``lambda/kappa < 1/sqrt(L)``."""
        report = {
            "lambda_attn": satisfies_variance_bound(self.lambda_attn, self.kappa_value, n_layers),
            "lambda_mlp": satisfies_variance_bound(self.lambda_mlp, self.kappa_value, n_layers),
        }
        report["all"] = all(report.values())
        return report

    def diagnostics(self, n_layers: int, blocks: Sequence[BlockNorms] = ()) -> dict[str, Any]:
        """``variance_bound``: the theorem condition ``lambda/kappa < 1/sqrt(L)`` at the initial lambdas
        (``at_init``, as ``variance_bound_report``) and, given the model's ``blocks``, at the largest learned
        ``|lambda|`` of each site (``learned_max_lambda_attn``/``_mlp``, ``learned_holds``)."""
        kappa = float(self.kappa_value)
        threshold = 1.0 / math.sqrt(n_layers)
        report: dict[str, Any] = {
            "n_layers": n_layers,
            "kappa": kappa,
            "lambda_attn": self.lambda_attn,
            "lambda_mlp": self.lambda_mlp,
            "threshold": threshold,
            "at_init": self.variance_bound_report(n_layers),
        }
        if blocks:
            learned = {
                site: max(float(getattr(b, site).lambda_.detach().abs().max()) for b in blocks)
                for site in ("attn_in", "mlp_in")
            }
            report["learned_max_lambda_attn"] = learned["attn_in"]
            report["learned_max_lambda_mlp"] = learned["mlp_in"]
            report["learned_holds"] = all(v / kappa < threshold for v in learned.values())
        return {"variance_bound": report}


@register_norm("bhyt")
class BHyTScheme(_BHyTSchemeBase):
    """BHyT with one reduction per block (docs/method.md, section 3).

    Args:
        lambda_attn: initial lambda of site A (before attention). Released default 2; the paper's text uses 1.
        lambda_mlp: initial lambda of site B (before the MLP). Default 1.
        lambda_final: 0 for an RMSNorm final norm (released default), else the initial lambda of a
            BHyT final norm with exact statistics.
        learnable_lambda: train the lambdas (True) or keep them fixed.
        p: Chebyshev coverage; ``kappa = 1/sqrt(1-p)``.
        kappa: set kappa directly instead of through ``p``.
        stat: ``rms`` (released code) or ``meanstd`` (paper: ``kappa*s + |mu|``).
        eps: epsilon inside the square root of the statistic.
        final_eps: epsilon of the RMSNorm final norm when ``lambda_final = 0``.
        seq_len: ``T`` in ``c = ||W_V W_O||_F^2 / (T d)``: the training sequence length, a run fact
            (``run_facts``) that every entry point binds with ``bind(seq_len=...)``; unbound (None), the
            model uses ``UNBOUND_SEQ_LEN`` = 1024, the paper's pretraining length.
        impl: ``auto`` (``fused`` on CPU and while compiling, ``reference`` eager on other devices),
            ``fused`` (``BHyTSiteFunction`` eager, fused ops while compiling) or ``reference`` (plain ops);
            same function either way.
        save_tanh: the eager ``BHyTSiteFunction`` saves each site's tanh for backward instead of recomputing
            it (one more activation-sized tensor per site; a memory-for-time variant the bench's ``prenorm``
            part times as ``bhyt:save_tanh=true``). Same function either way.
        exact_layers: layers whose site B uses exact statistics (a second reduction over ``h``, as
            ``bhyt_exact``) instead of the approximation: None (the released method), an int ``k`` for
            the first ``k`` layers, or a list of 0-based layer indices (stored as a sorted tuple).
            Parameter names do not change. YAML ``exact_layers: [0, 1]``; study/bench
            ``bhyt:exact_layers=[0,1]``.
    """

    approximate = True
    needs_constant_refresh = True
    run_facts = ("seq_len",)
    run_fact_fallbacks = {"seq_len": UNBOUND_SEQ_LEN}

    def __init__(
        self,
        lambda_attn: float = 2.0,
        lambda_mlp: float = 1.0,
        lambda_final: float = 0.0,
        learnable_lambda: bool = True,
        p: float = 0.99,
        kappa: float | None = None,
        stat: str = "rms",
        eps: float = 1e-6,
        final_eps: float = 1e-5,
        seq_len: int | None = None,
        impl: str = "auto",
        exact_layers: int | list[int] | None = None,
        save_tanh: bool = False,
    ) -> None:
        self.seq_len = seq_len
        if not (seq_len is None or (isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0)):
            self._raise_if([f"seq_len must be a positive int (or None until the run binds it), got {seq_len!r}"])
        self.exact_layers = _exact_layers(exact_layers)
        super().__init__(
            lambda_attn, lambda_mlp, lambda_final, learnable_lambda, p, kappa, stat, eps, final_eps, impl, save_tanh
        )

    def _seq_len(self) -> int:
        return self.seq_len if self.seq_len is not None else self.run_fact_fallbacks["seq_len"]

    def approximates(self, layer_idx: int, n_layers: int) -> bool:
        exact = self.exact_layers
        if isinstance(exact, tuple) and exact and exact[-1] >= n_layers:
            raise ValueError(
                f"invalid 'bhyt' norm configuration: exact_layers {list(exact)} names layers beyond the model's "
                f"{n_layers} (indices are 0-based, 0 .. {n_layers - 1})"
            )
        if exact is None:
            return True
        return layer_idx >= exact if isinstance(exact, int) else layer_idx not in exact


@register_norm("bhyt_exact")
class BHyTExactScheme(_BHyTSchemeBase):
    """BHyT* : exact statistics at both sites (a second reduction over ``h``), no cached constant.

    Takes the same arguments as ``bhyt`` except ``seq_len``.
    """

    approximate = False
