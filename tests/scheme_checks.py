"""The checks every norm scheme passes, written once: ``SchemeChecks``.

A test class that inherits ``SchemeChecks`` and provides two fixtures gets every check below: ``case``, a
``SchemeCase`` (a registered scheme, its arguments and model options, and its float64 reference) for each
configuration the reference lists, and ``scheme``, the scheme at its defaults. The checks whose outcome
depends on the configuration (the float64 reference, the KV cache) run on every ``case``; the others once
per ``scheme``. Two classes do:
``tests/norms/test_schemes.py`` runs them on every registered scheme (``registered_norms()``) at its defaults
and at the cases its reference lists, and ``tests/norms/test_new_scheme.py`` on a scheme registered by that
test file alone. A new check added here reaches both; a new scheme needs no edit here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from reference_model import SchemeReference, model_ref
from torch import nn

from bhyt_pl import Llama, LlamaConfig, parameter_groups
from bhyt_pl.norms import build_norm_scheme

SITES = ("attn_in", "attn_out", "attn_res", "mlp_in", "mlp_out", "mlp_res")


@dataclass(frozen=True)
class SchemeCase:
    """One registered scheme at one configuration, with the float64 reference it is checked against."""

    norm: str
    args: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    reference: SchemeReference | None = None
    """None: the scheme has no reference yet, and the float64 check fails saying where to add it."""
    reference_home: str = "the scheme's test file"
    """Where the reference belongs (named in the failure)."""

    def config(self, **shape: Any) -> LlamaConfig:
        """A small model of this case (3 layers: a reference's cases may name layer 2); the scheme's required
        settings (nGPT's untied embeddings) applied."""
        base = dict(vocab_size=97, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, mlp_dim=48, max_seq_len=64)
        settings = build_norm_scheme(self.norm, **self.args).model_settings
        fields = {**base, **settings, **self.overrides, **shape}
        return LlamaConfig.from_name("tiny", **fields, norm=self.norm, norm_args=self.args)


def perturb_norm_params(model: Llama) -> None:
    """Move every gain, lambda, alpha, shift, beta and scale (parameters and fixed buffers) away from its init
    so a misplaced one shows (zero-initialised ones, such as biases, Derf's shift and SeeDNorm's beta, get a
    random offset); weight-derived constants (BHyT's c) are then recomputed from the weights."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.ndim < 2 and t.is_floating_point():
                if not t.any():
                    t.add_(0.2 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
                t.mul_(1 + 0.3 * torch.rand(t.shape, generator=gen, dtype=t.dtype))
    model.refresh_norm_constants()


def float64_model(config: LlamaConfig) -> Llama:
    """The model in float64 with weights larger than N(0, 0.02), so every block does something measurable."""
    model = Llama(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)
    model.constrain_weights()
    model.refresh_norm_constants()
    return model


class SchemeChecks:
    """Per-scheme checks; a subclass provides the ``case`` and ``scheme`` fixtures (``SchemeCase``)."""

    def test_matches_float64_reference(self, case: SchemeCase) -> None:
        """The model's logits equal a float64 re-computation from the formulas of docs/method.md."""
        if case.reference is None:
            pytest.fail(
                f"norm scheme {case.norm!r} has no float64 reference: add REFERENCES[{case.norm!r}] = "
                f"SchemeReference(...) to {case.reference_home} (tests/reference_model.py describes it)"
            )
        model = float64_model(case.config(vocab_size=64))
        perturb_norm_params(model)
        idx = torch.randint(0, 64, (2, 11))
        with torch.no_grad():
            ours = model(idx)
        torch.testing.assert_close(ours, model_ref(model, idx, case.reference, case.args), rtol=1e-9, atol=1e-9)

    def test_kv_cache_matches_full_forward(self, case: SchemeCase) -> None:
        model = Llama(case.config()).eval()
        idx = torch.randint(0, 97, (2, 24))
        with torch.no_grad():
            full = model(idx)
            cache = model.new_kv_cache(2, 24)
            pieces = [model(idx[:, :10], cache, 0)]  # prefill
            pieces.append(model(idx[:, 10:15], cache, 10))  # a chunk after a prefix (explicit mask)
            for t in range(15, 24):  # one token at a time
                pieces.append(model(idx[:, t : t + 1], cache, t))
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)

    def test_meta_device_build_materialise_reset(self, scheme: SchemeCase) -> None:
        config = scheme.config()
        with torch.device("meta"):
            model = Llama(config)
        assert all(p.is_meta for p in model.parameters())
        model.to_empty(device="cpu")
        model.reset_parameters()
        reference = Llama(config)
        width = {id(w): dim for w, dim in model.width_matrices()}
        for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            assert torch.isfinite(p).all(), n
            if p.ndim < 2:  # norm parameters are deterministic: identical to a normal build
                torch.testing.assert_close(p, q, msg=n)
            elif id(p) in width and torch.allclose(p.norm(dim=width[id(p)]), torch.ones(())):
                pass  # a scheme's weight constraint (nGPT: unit norm along the model width), checked below
            else:  # N(0, 0.02)
                assert abs(p.std().item() - 0.02) < 0.004, n
                assert abs(p.mean().item()) < 0.004, n
        state = {k: v.clone() for k, v in model.state_dict(keep_vars=False).items()}
        buffers = {k: v.clone() for k, v in model.named_buffers()}
        model.constrain_weights()  # reset already satisfies the scheme's constraint
        model.refresh_norm_constants()  # and already refreshed the weight-derived constants (BHyT's c)
        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, state[key], msg=key)
        for key, value in model.named_buffers():
            torch.testing.assert_close(value, buffers[key], msg=key)
        assert (model.lm_head is None) == config.tie_embeddings  # tied: the output projection reads embed.weight
        out = model(torch.randint(0, 97, (1, 8)))
        assert torch.isfinite(out).all()

    def test_state_dict_round_trip_and_keys(self, scheme: SchemeCase) -> None:
        """A state dict loads strictly into a fresh model of the same config and reproduces its logits; a site
        a scheme leaves unused has no parameters and so no keys, and QK-norm adds exactly its two gains."""
        model = Llama(scheme.config()).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim < 2:
                    p.add_(0.1)
        fresh = Llama(scheme.config()).eval()
        fresh.load_state_dict(model.state_dict(), strict=True)
        idx = torch.randint(0, 97, (1, 12))
        with torch.no_grad():
            torch.testing.assert_close(fresh(idx), model(idx))
        keys = set(model.state_dict())
        for i, layer in enumerate(model.layers):
            for site in SITES:
                if isinstance(getattr(layer.norms, site), nn.Identity):
                    assert not any(k.startswith(f"layers.{i}.norms.{site}.") for k in keys), (i, site)
        layers = range(len(model.layers))
        if not build_norm_scheme(scheme.norm).owns_attention_norms:
            with_qk = set(Llama(scheme.config(qk_norm="head")).state_dict())
            assert with_qk - keys == {f"layers.{i}.attn.{n}_norm.weight" for i in layers for n in "qk"}

    def test_forward_backward_under_bf16_autocast(self, scheme: SchemeCase) -> None:
        """bf16-mixed as Lightning runs it: float32 parameters, the forward under ``torch.autocast`` (bfloat16),
        so a scheme that mixes a float32 stream with a bfloat16 matmul output must promote (nGPT's update)."""
        torch.manual_seed(0)
        model = Llama(scheme.config())
        idx = torch.randint(0, 97, (2, 16))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(idx)
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx.roll(-1, dims=1).flatten())
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    def test_hparams_round_trip(self, case: SchemeCase) -> None:
        """A scheme rebuilt from its ``hparams()`` is equal to it (checkpoints and configs store these)."""
        scheme = build_norm_scheme(case.norm, **case.args)
        assert type(scheme)(**scheme.hparams()) == scheme
        assert build_norm_scheme(case.norm, **scheme.hparams()) == scheme

    def test_parameter_groups_never_decay_norm_parameters(self, scheme: SchemeCase) -> None:
        model = Llama(scheme.config())
        decay, no_decay = parameter_groups(model, 0.1)
        sites = {"norms", "final_norm", "emb_norm", "q_norm", "k_norm", "v_norm"}
        scales = {"sq", "sk", "s_up", "s_gate", "s_z"}  # nGPT's, on attention, the MLP and the model
        norm_params = {
            id(p) for n, p in model.named_parameters() if sites & set(n.split(".")) or n.split(".")[-1] in scales
        }
        assert norm_params == {id(p) for p in no_decay["params"]}
        assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
        # every parameter is in exactly one group, tied embeddings once
        assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
        assert all(p.ndim == 2 for p in decay["params"])

    def test_trains_one_step(self, scheme: SchemeCase) -> None:
        """Two AdamW steps on one batch lower its loss, and every norm parameter gets a gradient."""
        torch.manual_seed(0)
        model = Llama(scheme.config())
        opt = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-2)
        idx = torch.randint(0, 97, (2, 17))
        losses = []
        for _ in range(2):
            loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.constrain_weights()
            losses.append(loss.item())
        assert losses[1] < losses[0]
        for name, p in model.named_parameters():
            if p.ndim < 2:
                assert p.grad is not None, name
