"""Hugging Face interop: Llama 3 RoPE scaling against transformers, and the export of every norm scheme
(logits and greedy generation through ``AutoModelForCausalLM``, user schemes, the export command)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.config import LLAMA3_ROPE_SCALING
from bhyt_pl.model import rope_cos_sin, rope_inv_freq
from bhyt_pl.norms import base, registered_norms

transformers = pytest.importorskip("transformers")

SCALING = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
"""Small enough to test past the original context cheaply: with head_dim 16 and theta 1e4 the 8
wavelengths are 6.3 (kept), 19.9 (interpolated) and 63 and longer (divided by 4)."""


def _config(norm: str = "rmsnorm", **kw) -> LlamaConfig:
    base_fields = dict(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48, max_seq_len=96)
    return LlamaConfig.from_name("tiny", **{**base_fields, "norm": norm, **kw})


# ----------------------------------------------------------------------------- RoPE scaling
def test_llama3_rope_scaling_matches_transformers_at_every_position() -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from bhyt_pl.convert import hf_config

    config = _config(dim=64, rope_theta=10000.0, rope_scaling=SCALING)  # head_dim 16
    positions = torch.arange(config.max_seq_len)  # 0 .. 95, three times the original context
    hf_rope = LlamaRotaryEmbedding(config=hf_config(config))
    hf_cos, hf_sin = hf_rope(torch.zeros(1, 1, dtype=torch.float64), positions[None])
    cos, sin = rope_cos_sin(positions, config.head_dim, config.rope_theta, torch.float64, config.rope_scaling)
    torch.testing.assert_close(cos, hf_cos[0].to(torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, hf_sin[0].to(torch.float64), atol=1e-6, rtol=0)
    plain_cos, _ = rope_cos_sin(positions, config.head_dim, config.rope_theta, torch.float64)
    # the scaling changes the low frequencies inside the original context too, not only past it
    assert (cos[1:32] - plain_cos[1:32]).abs().max() > 1e-2


def test_scaled_model_matches_transformers_and_round_trips() -> None:
    from bhyt_pl.convert import from_hf_llama, to_hf_llama

    config = _config(dim=64, rope_theta=10000.0, rope_scaling=SCALING)
    model = Llama(config).eval()
    hf = to_hf_llama(model)
    assert hf.config.rope_parameters["rope_type"] == "llama3"
    idx = torch.randint(0, 97, (2, 96))  # positions past original_max_position_embeddings = 32
    with torch.no_grad():
        torch.testing.assert_close(model(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)
        back = from_hf_llama(hf)
        assert back.config.rope_scaling == SCALING
        torch.testing.assert_close(back(idx), model(idx))


def test_llama32_scaling_changes_17_of_32_frequencies_and_presets() -> None:
    plain, scaled = rope_inv_freq(64, 500000.0), rope_inv_freq(64, 500000.0, LLAMA3_ROPE_SCALING)
    assert int((plain != scaled).sum()) == 17
    for name in ("llama-374m", "llama-1b", "llama-3b"):
        assert LlamaConfig.from_name(name).rope_scaling == LLAMA3_ROPE_SCALING
    for name in ("tiny", "small", "deep-24x128", "deep-32x128"):
        assert LlamaConfig.from_name(name).rope_scaling is None


@pytest.mark.parametrize(
    "scaling, match",
    [
        ({**SCALING, "rope_type": "yarn"}, "rope_type must be 'llama3'"),
        ({k: v for k, v in SCALING.items() if k != "factor"}, r"missing \['factor'\]"),
        ({**SCALING, "factor": 0}, "rope_scaling.factor must be a number > 0"),
        ({**SCALING, "high_freq_factor": 0.5}, "must be greater than low_freq_factor"),
        ("llama3", "rope_scaling must be a mapping"),
    ],
)
def test_rope_scaling_errors(scaling, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _config(rope_scaling=scaling)


def test_unsupported_hf_rope_type_is_refused() -> None:
    from bhyt_pl.convert import rope_scaling_from_hf

    config = transformers.LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="'linear' is not implemented"):
        rope_scaling_from_hf(config)


def test_one_mapping_names_every_size_field_both_ways() -> None:
    from bhyt_pl.convert import from_hf_llama, hf_config
    from bhyt_pl.hf_config import HF_FIELDS, from_hf_fields

    config = LlamaConfig.from_name("tiny", n_layers=2, head_dim=48, init_std=0.03, tie_embeddings=False)
    hf = hf_config(config)
    expected = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 48, "max_position_embeddings": 512, "vocab_size": 8192,
                "initializer_range": 0.03, "tie_word_embeddings": False}  # fmt: skip
    assert {key: getattr(hf, key) for key in expected} == expected
    assert set(HF_FIELDS.values()) == set(expected)
    assert from_hf_fields(hf) == {field: getattr(config, field) for field in HF_FIELDS}
    back = from_hf_llama(transformers.LlamaForCausalLM(hf)).config
    assert {f: getattr(back, f) for f in HF_FIELDS} == {f: getattr(config, f) for f in HF_FIELDS}


# ----------------------------------------------------------------------------- export
def _variants() -> list:
    """Every registered scheme, plus options that must export too (a missing option fails, never skips)."""
    cases = [pytest.param(norm, {}, {}, id=norm) for norm in registered_norms()]
    cases.append(pytest.param("bhyt", {"lambda_final": 3.0, "stat": "meanstd"}, {}, id="bhyt-final-meanstd"))
    cases.append(pytest.param("dyt", {}, {"tie_embeddings": False, "rope_scaling": SCALING}, id="dyt-untied-scaled"))
    cases.append(pytest.param("rmsnorm", {}, {"qk_norm": True}, id="rmsnorm-qk_norm"))
    cases.append(pytest.param("bhyt", {}, {"qk_norm": True}, id="bhyt-qk_norm"))
    cases.append(pytest.param("reordered", {}, {"qk_norm": "full"}, id="olmo2-reordered-qk_full"))
    cases.append(pytest.param("hybridnorm", {"star": True}, {}, id="hybridnorm-star"))
    cases.append(pytest.param("bhyt", {"exact_layers": [0]}, {}, id="bhyt-exact_layers"))
    return cases


def _perturbed(model: Llama, scale: float = 0.1) -> Llama:
    """Every parameter moved off its init (gains, lambdas, alphas, scales too), constants refreshed."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g) * p.abs().mean().clamp_min(0.1))
    model.constrain_weights()  # a trained model satisfies its scheme's constraint (nGPT's unit norms)
    model.refresh_norm_constants()
    return model.eval()


def _trained_on_progressions(model: Llama, steps: int = 60) -> Llama:
    """A few AdamW steps on arithmetic progressions mod the vocabulary (about a second)."""
    g = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        start, step = torch.randint(0, 97, (16, 1), generator=g), torch.randint(1, 6, (16, 1), generator=g)
        seq = (start + step * torch.arange(33)) % 97  # [16, 33]
        loss = torch.nn.functional.cross_entropy(model(seq[:, :-1]).flatten(0, 1), seq[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.refresh_norm_constants()
    return model.eval()


def _no_package_import(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n == "bhyt_pl" or n.startswith("bhyt_pl.") for n in names):
            return False
    return True


@pytest.mark.parametrize("norm, norm_args, fields", _variants())
def test_export_logits_parity(norm: str, norm_args: dict, fields: dict, tmp_path: Path) -> None:
    from bhyt_pl.convert import MODELING_FILE, save_hf, stock_llama_compatible

    model = _perturbed(Llama(_config(norm, norm_args=norm_args, **fields)))
    out = save_hf(model, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    stock = stock_llama_compatible(model)
    assert stock == (norm == "rmsnorm" and not fields.get("qk_norm", False))
    if stock:
        assert type(hf) is transformers.LlamaForCausalLM and not (out / MODELING_FILE).exists()
    else:
        assert type(hf).__name__ == "BHyTLlamaForCausalLM"
        assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"].endswith("CausalLM")
        assert _no_package_import((out / MODELING_FILE).read_text())
    assert (out / "model.safetensors").exists()
    idx = torch.randint(0, 97, (2, 96))
    with torch.no_grad():
        err = (model(idx) - hf(idx).logits).abs().max().item()
    print(f"export parity {norm} {norm_args} {fields}: max |logit diff| = {err:.3g}")
    assert err < 1e-4


@pytest.mark.parametrize("norm", ["bhyt", "rmsnorm"])
def test_export_greedy_generation_parity(norm: str, tmp_path: Path) -> None:
    from bhyt_pl.convert import save_hf

    model = _trained_on_progressions(Llama(_config(norm)))  # greedy continues them: varied tokens
    hf = transformers.AutoModelForCausalLM.from_pretrained(save_hf(model, tmp_path), trust_remote_code=True).eval()
    prompt = torch.stack([torch.arange(5, 40, 5), torch.arange(60, 74, 2)]) % 97  # [2, 7]
    ours = model.generate(prompt, max_new_tokens=24)
    mask = torch.ones_like(prompt)
    theirs = hf.generate(prompt, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None)
    assert theirs.tolist() == ours.tolist()
    assert len(set(ours[0, 7:].tolist())) > 3
    seq = ours[:, :20].clone()  # out of inference mode
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(seq)[:, :-1].flatten(0, 1), seq[:, 1:].flatten())
        assert hf(seq, labels=seq).loss.item() == pytest.approx(expected.item(), rel=1e-5)
    if norm != "rmsnorm":  # the exported shell refuses padding it cannot mask (stock Llama handles it)
        with pytest.raises(ValueError, match="unpadded inputs only"):
            hf(seq, attention_mask=torch.ones_like(seq).index_fill(1, torch.tensor([0]), 0))


def test_bundle_refuses_what_it_cannot_ship() -> None:
    from bhyt_pl.source_bundle import BundleError, bundle_source

    with pytest.raises(BundleError, match="is not a top-level class or function of bhyt_pl"):
        bundle_source([torch.nn.Linear])
    with pytest.raises(BundleError, match="extra source #0 defines 'rope_inv_freq', which bhyt_pl.model defines too"):
        bundle_source([rope_cos_sin], ["def rope_inv_freq(*args):\n    return None\n"])
    source = bundle_source([rope_cos_sin])
    assert "def rope_inv_freq(" in source and "class Llama" not in source and _no_package_import(source)
    namespace: dict = {}
    exec(compile(source, "bundle", "exec"), namespace)  # runs on its own and computes what the package does
    torch.testing.assert_close(
        namespace["rope_cos_sin"](torch.arange(5), 8, 1e4), rope_cos_sin(torch.arange(5), 8, 1e4)
    )


@pytest.mark.slow  # a second Python process
def test_export_loads_without_the_package(tmp_path: Path) -> None:
    from bhyt_pl.convert import save_hf

    model = _perturbed(Llama(_config("bhyt", norm_args={"lambda_final": 2.0})))
    save_hf(model, tmp_path / "hf", tokenizer="embedded")
    idx = torch.randint(0, 97, (1, 50))
    torch.save({"idx": idx, "logits": model(idx).detach()}, tmp_path / "ref.pt")
    script = textwrap.dedent(
        f"""
        import sys
        for name in [m for m in sys.modules if m == "bhyt_pl" or m.startswith("bhyt_pl.")]:
            del sys.modules[name]
        sys.modules["bhyt_pl"] = None  # any import of the package fails
        import torch, transformers
        ref = torch.load({str(tmp_path / "ref.pt")!r})
        model = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / "hf")!r}, trust_remote_code=True)
        tok = transformers.AutoTokenizer.from_pretrained({str(tmp_path / "hf")!r}, trust_remote_code=True)
        assert tok("In the beginning").input_ids[0] == tok.bos_token_id == 0
        err = (model(ref["idx"]).logits - ref["logits"]).abs().max().item()
        assert err < 1e-4, err
        print("ok", err)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_user_scheme_exports_through_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bhyt_pl.convert import save_hf

    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # registrations end with the test
    module_file = tmp_path / "my_norms.py"
    module_file.write_text(
        textwrap.dedent(
            """
            import inspect
            import sys

            import torch
            from torch import nn

            from bhyt_pl.norms import BlockNorms, NormScheme, register_norm


            class ScaledTanh(nn.Module):
                def __init__(self, dim: int) -> None:
                    super().__init__()
                    self.weight = nn.Parameter(torch.ones(dim))

                def forward(self, x: torch.Tensor) -> torch.Tensor:
                    return self.weight * torch.tanh(x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())


            @register_norm("my_tanh")
            class MyTanh(NormScheme):
                def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
                    return BlockNorms(attn_in=ScaledTanh(dim), mlp_in=ScaledTanh(dim))

                @classmethod
                def export_source(cls) -> str:
                    return inspect.getsource(sys.modules[cls.__module__])


            @register_norm("my_closed")
            class MyClosed(MyTanh):
                @classmethod
                def export_source(cls) -> None:
                    return None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_norms", raising=False)
    __import__("my_norms")
    model = _perturbed(Llama(_config("my_tanh")))
    hf = transformers.AutoModelForCausalLM.from_pretrained(save_hf(model, tmp_path / "hf"), trust_remote_code=True)
    idx = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        assert (model(idx) - hf(idx).logits).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match=r"norm scheme 'my_closed' \(my_norms.MyClosed\) cannot be exported"):
        save_hf(Llama(_config("my_closed")), tmp_path / "closed")


def test_export_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from bhyt_pl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--ckpt_path" in help_text and "--out" in help_text and "trust_remote_code" in help_text
    model = _perturbed(Llama(_config("peri_ln", vocab_size=8192)))
    ckpt = tmp_path / "last.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    meta = {"model_config": model.config.to_dict(), "tokenizer": "embedded"}
    torch.save({"state_dict": state, "bhyt_pl": meta}, ckpt)
    assert main(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0
    assert "exported 'peri_ln' model" in capsys.readouterr().out
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert hf.dtype == torch.bfloat16
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|end_of_text|>"


def test_export_refuses_a_non_empty_folder_unless_overwrite(tmp_path: Path, monkeypatch, capsys) -> None:
    """It wrote over the user's files in ``--out`` and exited 0."""
    import sys

    from bhyt_pl.cli import main

    model = Llama(_config("rmsnorm", vocab_size=8192))
    ckpt = tmp_path / "last.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "bhyt_pl": {"model_config": model.config.to_dict(), "tokenizer": None}}, ckpt)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("my own config")
    (out / "notes.txt").write_text("my notes")
    monkeypatch.setattr(sys, "argv", ["bhyt_pl", "export", "--ckpt_path", str(ckpt), "--out", str(out)])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert f"error: --out {str(out)!r} is not empty (2 entries: config.json, notes.txt)" in err and "--overwrite" in err
    assert (out / "config.json").read_text() == "my own config"  # untouched
    assert main(["export", "--ckpt_path", str(ckpt), "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "my notes"  # only the files the export writes are replaced
    assert transformers.AutoConfig.from_pretrained(out).model_type == "llama"


def test_hf_key_map_refuses_query_key_norms_naming_the_value() -> None:
    from bhyt_pl.convert import hf_key_map

    with pytest.raises(ValueError, match=r"qk_norm='full' does not map onto Hugging Face Llama .* use qk_norm=False"):
        hf_key_map(_config(qk_norm="full"))


@pytest.mark.parametrize("norm", ["rmsnorm", "dyt"])  # save_pretrained's path and save_file's
def test_exported_files_have_the_mode_the_umask_gives(norm: str, tmp_path: Path) -> None:
    """``model.safetensors`` was 0600 (safetensors writes through ``mkstemp``), unreadable to other users of a
    shared machine; a user's own file in ``--out`` keeps its mode."""
    import os

    from bhyt_pl.convert import save_hf

    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "notes.txt").chmod(0o600)
    old = os.umask(0o027)
    try:
        save_hf(Llama(_config(norm, vocab_size=8192)), out, tokenizer="embedded")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes.pop("notes.txt") == 0o600
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes  # 0o666 & ~0o027


def test_export_refuses_a_shortened_flag_rather_than_reading_it_as_the_flag_it_starts(capsys) -> None:
    from bhyt_pl.convert import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--ckpt_path", "x.ckpt", "--out", "y", "--overwr"])  # not --overwrite
    assert exit_info.value.code == 2 and "unrecognized arguments: --overwr" in capsys.readouterr().err
