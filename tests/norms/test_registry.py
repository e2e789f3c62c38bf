"""The registry: names, errors that name the field and the accepted values, user schemes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bhyt_pl import Llama, LlamaConfig, parameter_groups
from bhyt_pl.norms import BlockNorms, NormScheme, build_norm_scheme, register_norm, registered_norms
from bhyt_pl.norms.base import _REGISTRY, scheme_class

BUILTIN = [
    "bhyt",
    "bhyt_exact",
    "derf",
    "dyisru",
    "dyt",
    "gpas",
    "hybridnorm",
    "layernorm",
    "lns",
    "mix_ln",
    "ngpt",
    "peri_ln",
    "post_ln",
    "reordered",
    "rmsnorm",
    "seednorm",
    "ssnorm",
]


def test_builtin_names() -> None:
    packaged = {n for n in registered_norms() if scheme_class(n).__module__.startswith("bhyt_pl.norms.")}
    assert set(BUILTIN) == packaged  # every scheme the package registers, and only those (tests add their own)
    assert len(BUILTIN) == 17


def test_unknown_name_lists_registered() -> None:
    with pytest.raises(ValueError, match=r"unknown norm 'rms_norm'; registered norms: .*bhyt.*rmsnorm"):
        build_norm_scheme("rms_norm")
    with pytest.raises(ValueError, match="unknown norm 'nope'"):
        LlamaConfig.from_name("tiny", norm="nope")


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("bhyt", {"lambda_attn": -1.0}, r"lambda_attn must be > 0, got -1.0"),
        ("bhyt", {"lambda_mlp": 0.0}, r"lambda_mlp must be > 0"),
        ("bhyt", {"lambda_final": -0.5}, r"lambda_final must be >= 0"),
        ("bhyt", {"p": 1.0}, r"p must be in \(0, 1\)"),
        ("bhyt_exact", {"p": 0.0}, r"p must be in \(0, 1\)"),
        ("bhyt", {"stat": "std"}, r"stat must be one of rms, meanstd; got 'std'"),
        ("bhyt", {"kappa": -2.0}, r"kappa must be > 0"),
        ("bhyt", {"seq_len": 0}, r"seq_len must be a positive int"),
        ("dyt", {"alpha_attn": 0.0}, r"alpha_attn must be > 0"),
        ("lns", {"base": "batchnorm"}, r"base must be one of rmsnorm, layernorm; got 'batchnorm'"),
        ("rmsnorm", {"eps": 0.0}, r"eps must be > 0"),
        ("derf", {"alpha_mlp": -0.1}, r"invalid 'derf' norm configuration:\n  - alpha_mlp must be > 0, got -0.1"),
        ("dyisru", {"beta_init": 0.0}, r"beta_init must be > 0 or None \(for d\), got 0.0"),
        ("seednorm", {"eps": -1.0}, r"invalid 'seednorm' norm configuration:\n  - eps must be > 0"),
        ("post_ln", {"eps": 0.0}, r"invalid 'post_ln' norm configuration:\n  - eps must be > 0"),
        ("mix_ln", {"alpha": 1.5}, r"alpha must be in \[0, 1\], got 1.5"),
        ("reordered", {"eps": 0.0}, r"invalid 'reordered' norm configuration:\n  - eps must be > 0"),
        ("hybridnorm", {"eps": -1.0}, r"invalid 'hybridnorm' norm configuration:\n  - eps must be > 0"),
        ("ssnorm", {"eps": 0.0}, r"invalid 'ssnorm' norm configuration:\n  - eps must be > 0"),
        ("gpas", {"eps": 0.0}, r"invalid 'gpas' norm configuration:\n  - eps must be > 0"),
    ],
)
def test_bad_values_name_the_field(name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_norm_scheme(name, **kwargs)


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ValueError, match=r"(?s)lambda_attn.*p must be.*stat must be"):
        build_norm_scheme("bhyt", lambda_attn=-1.0, p=2.0, stat="x")


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="lambda_atn"):
        build_norm_scheme("bhyt", lambda_atn=1.0)


def test_hparams_round_trip() -> None:
    for name in BUILTIN:
        scheme = build_norm_scheme(name)
        assert type(scheme)(**scheme.hparams()) == scheme
    assert build_norm_scheme("bhyt", lambda_attn=1.0).hparams()["lambda_attn"] == 1.0


@pytest.fixture
def scaled_tanh_registered():
    """A user scheme registered from test code, removed afterwards."""

    class ScaledTanh(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def reset_parameters(self) -> None:
            nn.init.ones_(self.weight)

        def forward(self, x):
            return self.weight * torch.tanh(x / x.abs().amax(-1, keepdim=True))

    @register_norm("test_scaled_tanh")
    class ScaledTanhScheme(NormScheme):
        def __init__(self, depth_gain: float = 1.0) -> None:
            self.depth_gain = depth_gain

        def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
            return BlockNorms(attn_in=ScaledTanh(dim), mlp_in=ScaledTanh(dim))

    yield ScaledTanhScheme
    _REGISTRY.pop("test_scaled_tanh")


def test_user_scheme_trains_one_step(scaled_tanh_registered) -> None:
    config = LlamaConfig.from_name("tiny", n_layers=2, norm="test_scaled_tanh", norm_args={"depth_gain": 2.0})
    model = Llama(config)
    assert type(model.layers[1].norms.attn_in).__name__ == "ScaledTanh"
    opt = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-2)
    idx = torch.randint(0, config.vocab_size, (2, 17))
    losses = []
    for _ in range(2):
        logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[1] < losses[0]
    assert model.layers[0].norms.attn_in.weight.grad is not None


def test_register_rejects_non_schemes_and_name_clashes() -> None:
    with pytest.raises(TypeError, match="NormScheme subclass"):
        register_norm("x")(object)

    class Other(NormScheme):
        pass

    with pytest.raises(ValueError, match="'rmsnorm' is already registered"):
        register_norm("rmsnorm")(Other)


def test_parameter_groups_never_decay_norm_parameters() -> None:
    for name in BUILTIN:
        model = Llama(LlamaConfig.from_name("tiny", n_layers=2, norm=name))
        decay, no_decay = parameter_groups(model, 0.1)
        sites = {"norms", "final_norm", "emb_norm", "q_norm", "k_norm", "v_norm"}
        scales = {"sq", "sk", "s_up", "s_gate", "s_z"}  # nGPT's, on attention, the MLP and the model
        norm_params = {
            id(p) for n, p in model.named_parameters() if sites & set(n.split(".")) or n.split(".")[-1] in scales
        }
        assert norm_params == {id(p) for p in no_decay["params"]}
        assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
        # every parameter is in exactly one group, tied embeddings once
        total = len(decay["params"]) + len(no_decay["params"])
        assert total == len(list(model.parameters()))
        assert all(p.ndim == 2 for p in decay["params"])
