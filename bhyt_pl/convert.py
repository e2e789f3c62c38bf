"""Hugging Face interoperability: export any model as a transformers folder, and map ``rmsnorm``
models to and from ``transformers.LlamaForCausalLM``.

- ``save_hf(model, out_dir, tokenizer)`` / ``python -m bhyt_pl export --ckpt_path CKPT --out DIR`` writes a
  folder that ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads, for every
  norm scheme: ``config.json`` (with ``auto_map``), ``modeling_bhyt_llama.py`` (generated from the
  package's own source by ``bhyt_pl.source_bundle``: the ``bhyt_pl.hf_modeling`` shell plus every
  class and function the model uses; no ``bhyt_pl`` import), ``model.safetensors`` and the tokenizer
  files. A plain ``rmsnorm`` model (Llama's exact architecture) is written as a stock
  ``LlamaForCausalLM`` instead, with no remote code.
- ``to_hf_llama``/``from_hf_llama`` convert ``rmsnorm`` models in memory, Llama 3 RoPE scaling included.

``transformers`` and ``safetensors`` are development dependencies, imported only inside functions here.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

import bhyt_pl.config
import bhyt_pl.init
import bhyt_pl.model
import bhyt_pl.norms
import bhyt_pl.norms.base
from bhyt_pl.config import ROPE_SCALING_KEYS, LlamaConfig
from bhyt_pl.hf_config import from_hf_fields, to_hf_fields
from bhyt_pl.model import Llama

__all__ = [
    "MODELING_FILE",
    "build_parser",
    "from_hf_llama",
    "hf_config",
    "hf_key_map",
    "hf_rope_scaling",
    "main",
    "modeling_source",
    "rope_scaling_from_hf",
    "save_hf",
    "stock_llama_compatible",
    "to_hf_llama",
]

MODELING_FILE = "modeling_bhyt_llama.py"
"""The generated modeling module inside an exported folder."""

MODELING_READING_ORDER = (bhyt_pl.config, bhyt_pl.norms.base, bhyt_pl.norms, bhyt_pl.init, bhyt_pl.model)
"""Modules whose definitions open the generated modeling file, in this order (the configuration, the norm
interface, the schemes, the init policy, the model); the transformers shell and the rest follow."""


def _require_rmsnorm(config: LlamaConfig) -> None:
    if config.norm != "rmsnorm":
        raise ValueError(f"only norm='rmsnorm' maps onto Hugging Face Llama; this model uses norm={config.norm!r}")
    if config.qk_norm:
        # LlamaForCausalLM has no query/key norms: a copy without them would compute something else
        raise ValueError(
            f"qk_norm={config.qk_norm!r} does not map onto Hugging Face Llama (it has no q/k norms); use qk_norm=False"
        )


def hf_key_map(config: LlamaConfig) -> dict[str, str]:
    """Our state-dict key -> Hugging Face Llama's key."""
    _require_rmsnorm(config)
    return _llama_keys(config)


def _llama_keys(config: LlamaConfig) -> dict[str, str]:
    keys = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    if not config.tie_embeddings:
        keys["lm_head.weight"] = "lm_head.weight"
    for i in range(config.n_layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            keys[f"layers.{i}.attn.{name}.weight"] = f"model.layers.{i}.self_attn.{name}.weight"
        for name in ("gate_proj", "up_proj", "down_proj"):
            keys[f"layers.{i}.mlp.{name}.weight"] = f"model.layers.{i}.mlp.{name}.weight"
        keys[f"layers.{i}.norms.attn_in.weight"] = f"model.layers.{i}.input_layernorm.weight"
        keys[f"layers.{i}.norms.mlp_in.weight"] = f"model.layers.{i}.post_attention_layernorm.weight"
    return keys


def stock_llama_compatible(model: Llama) -> bool:
    """Whether ``model`` is exactly Hugging Face Llama: the ``rmsnorm`` scheme (one eps everywhere) and
    no tensor beyond Llama's (a QK-norm or any other addition adds state-dict keys)."""
    if model.config.norm != "rmsnorm":
        return False
    eps = {m.eps for m in model.modules() if hasattr(m, "eps")}
    return len(eps) <= 1 and set(model.state_dict()) == set(_llama_keys(model.config))


def hf_rope_scaling(config: LlamaConfig) -> dict[str, Any] | None:
    """``config.rope_scaling`` as Hugging Face's ``rope_scaling`` (None for plain RoPE)."""
    return dict(config.rope_scaling) if config.rope_scaling is not None else None


def rope_scaling_from_hf(hf_config: Any) -> dict[str, Any] | None:
    """Our ``rope_scaling`` from a ``transformers`` config (v5 ``rope_parameters`` or v4 ``rope_scaling``).

    Raises:
        ValueError: a RoPE type other than the default and ``llama3``.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ValueError(f"RoPE type {rope_type!r} is not implemented; only the default RoPE and 'llama3' map")
    params["rope_type"] = "llama3"
    params.setdefault("original_max_position_embeddings", hf_config.max_position_embeddings)
    return {key: params[key] for key in ROPE_SCALING_KEYS}


def hf_config(config: LlamaConfig) -> Any:
    """The ``transformers.LlamaConfig`` of the same architecture."""
    import transformers

    _require_rmsnorm(config)
    return transformers.LlamaConfig(
        **to_hf_fields(config),
        rope_theta=config.rope_theta,
        rope_scaling=hf_rope_scaling(config),
        rms_norm_eps=config.norm_scheme().eps,  # _require_rmsnorm: an RMSNormScheme
        attention_bias=False,
        mlp_bias=False,
    )


def to_hf_llama(model: Llama) -> Any:
    """A ``transformers.LlamaForCausalLM`` with a copy of ``model``'s weights (same dtype)."""
    import transformers

    hf = transformers.LlamaForCausalLM(hf_config(model.config)).to(model.embed.weight.dtype)
    ours = model.state_dict()
    sd = {hf_key: ours[key].detach().clone() for key, hf_key in hf_key_map(model.config).items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (model.config.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing={missing}, unexpected={unexpected}")
    if model.config.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def from_hf_llama(hf_model: Any) -> Llama:
    """Our ``rmsnorm`` model with the weights of a ``transformers.LlamaForCausalLM`` (default or ``llama3`` RoPE)."""
    c = hf_model.config
    rope = getattr(c, "rope_parameters", None) or {}
    rope_scaling = rope_scaling_from_hf(c)
    config = LlamaConfig(
        name="from-hf",
        **from_hf_fields(c),
        rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
        rope_scaling=rope_scaling,
        norm="rmsnorm",
        norm_args={"eps": float(c.rms_norm_eps)},
    )
    hf_sd = hf_model.state_dict()
    qk_keys = [k for k in hf_sd if k.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight"))]
    if qk_keys:  # e.g. a Qwen3/OLMo-2-style model: dropping its q/k norms would silently change it
        raise ValueError(f"the Hugging Face model has query/key norms ({qk_keys[0]}, ...), which Llama does not map")
    with torch.device("meta"):
        model = Llama(config)
    model.to_empty(device="cpu")
    model.load_state_dict({key: hf_sd[hf_key].float() for key, hf_key in hf_key_map(config).items()})
    return model.to(next(hf_model.parameters()).dtype)


# ----------------------------------------------------------------------------- export
def modeling_source(model: Llama) -> str:
    """The self-contained modeling module of ``model``'s export, generated from the package's source.

    Raises:
        ValueError: the model's norm scheme is not part of bhyt_pl and provides no source
            (``NormScheme.export_source``).
    """
    from bhyt_pl._version import __version__
    from bhyt_pl.hf_modeling import BHyTLlamaConfig, BHyTLlamaForCausalLM, TransformersCacheView
    from bhyt_pl.source_bundle import bundle_source, bundled_module

    scheme = model.config.norm_scheme()
    roots: list[Any] = [BHyTLlamaConfig, TransformersCacheView, BHyTLlamaForCausalLM]
    extra: list[str] = []
    cls = type(scheme)
    if bundled_module(cls.__module__):
        roots.append(cls)
    else:
        source = cls.export_source()
        if source is None:
            raise ValueError(
                f"norm scheme {model.config.norm!r} ({cls.__module__}.{cls.__qualname__}) cannot be exported: it is "
                "not part of bhyt_pl and its export_source() returns None. Return the source of the module that "
                "defines it, e.g. `inspect.getsource(sys.modules[cls.__module__])`, to ship it with the model"
            )
        extra.append(source)
    header = (
        f'"""The bhyt_pl {__version__} Llama with the {model.config.norm!r} norm scheme, for transformers.\n\n'
        "Generated by `python -m bhyt_pl export` (bhyt_pl.convert.save_hf) from bhyt_pl's own source: the\n"
        "transformers shell of bhyt_pl.hf_modeling and every bhyt_pl definition it uses. Do not edit; export again.\n"
        '"""'
    )
    return bundle_source(roots, extra, header=header, reading_order=MODELING_READING_ORDER)


def save_hf(model: Llama, out_dir: str | Path, tokenizer: Any = None) -> Path:
    """Write ``model`` as a Hugging Face folder that ``AutoModelForCausalLM.from_pretrained`` loads.

    A plain ``rmsnorm`` model (``stock_llama_compatible``) becomes a stock ``LlamaForCausalLM``; any
    other scheme gets generated modeling code (load it with ``trust_remote_code=True``). Weights are
    written as safetensors in the model's dtype.

    Args:
        model: the model to export (any norm scheme registered in bhyt_pl, or one of your own that
            implements ``NormScheme.export_source``).
        out_dir: the folder (created if missing).
        tokenizer: a ``tokenizers.Tokenizer``, a name or path for ``bhyt_pl.data.load_tokenizer``
            (``"embedded"``, ``tokenizer.json``, a Hub name), or None to write no tokenizer files.

    Returns:
        ``out_dir`` as a ``Path``.

    Example:
        >>> from bhyt_pl import Llama, LlamaConfig
        >>> save_hf(Llama(LlamaConfig.from_name("tiny", norm="bhyt")), "tiny-bhyt-hf", "embedded")  # doctest: +SKIP
        >>> import transformers
        >>> transformers.AutoModelForCausalLM.from_pretrained("tiny-bhyt-hf", trust_remote_code=True)  # doctest: +SKIP
    """
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    from bhyt_pl.data.tokenizer import SpecialTokens, load_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = {p.name: p.stat().st_ino for p in out.iterdir()}  # files this export creates get new inodes
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    special = SpecialTokens.from_tokenizer(tok) if tok is not None else None
    token_ids = {"bos_token_id": special.bos_id, "eos_token_id": special.eos_id} if special else {}
    dtype = model.embed.weight.dtype
    if stock_llama_compatible(model):
        hf = to_hf_llama(model)
        for key, value in token_ids.items():
            setattr(hf.config, key, value)
        hf.config.dtype = dtype
        hf.generation_config = GenerationConfig.from_model_config(hf.config)
        hf.save_pretrained(out)
    else:
        from bhyt_pl.hf_modeling import BHyTLlamaConfig

        (out / MODELING_FILE).write_text(modeling_source(model))
        module = MODELING_FILE.removesuffix(".py")
        config = BHyTLlamaConfig(
            bhyt=model.config.to_dict(),
            architectures=["BHyTLlamaForCausalLM"],
            auto_map={
                "AutoConfig": f"{module}.BHyTLlamaConfig",
                "AutoModelForCausalLM": f"{module}.BHyTLlamaForCausalLM",
            },
            **token_ids,
        )
        config.dtype = dtype
        config.save_pretrained(out)
        GenerationConfig.from_model_config(config).save_pretrained(out)
        weights = {f"model.{k}": v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    if tok is not None:
        _save_tokenizer(tok, special, model.config.max_seq_len, out)
    _apply_umask([p for p in out.iterdir() if p.is_file() and before.get(p.name) != p.stat().st_ino])
    return out


def _apply_umask(paths: list[Path]) -> None:
    """Give files this export created the mode a plain ``open`` gives a new file (``0o666`` less the umask).
    safetensors writes through a temporary file, which ``mkstemp`` creates ``0o600``, so ``model.safetensors``
    was unreadable to the other users of a shared machine while every other exported file was not. Files
    rewritten in place keep their inode and their mode, as ``open`` would leave it."""
    umask = os.umask(0)  # reading the umask means setting it; put it back at once
    os.umask(umask)
    for path in paths:
        path.chmod(0o666 & ~umask)


def _save_tokenizer(tok: Any, special: Any, max_length: int, out: Path) -> None:
    """``tokenizer.json`` and its transformers config; encoding adds BOS as in pretraining (the Llama-3
    tokenizers and the embedded one already do, through their post-processor)."""
    from transformers import PreTrainedTokenizerFast

    names = {"bos_token": special.bos_id, "eos_token": special.eos_id, "pad_token": special.pad_id}
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=max_length, **{k: tok.id_to_token(i) for k, i in names.items()}
    )
    wrapped.save_pretrained(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bhyt_pl export",
        allow_abbrev=False,  # a shortened flag is an error, never read as the flag it starts
        description="Export a bhyt_pl LlamaLM checkpoint (any norm scheme) as a Hugging Face folder: config.json, "
        "model.safetensors, the tokenizer files and, for every scheme but plain rmsnorm, generated modeling code "
        "(load it with AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)). A plain rmsnorm model is "
        "written as a stock LlamaForCausalLM.",
        epilog="Example: python -m bhyt_pl export --ckpt_path runs/tiny-bhyt/version_0/checkpoints/last.ckpt "
        "--out tiny-bhyt-hf; "
        "then lm_eval --model hf --model_args pretrained=tiny-bhyt-hf,trust_remote_code=True --tasks arc_easy",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--ckpt_path", required=True, help="LlamaLM checkpoint: a .ckpt file or a sharded folder.")
    p.add_argument("--out", required=True, help="Output folder: new or empty (created if missing).")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="Export into a non-empty --out: the files the export writes are replaced, every other file is kept.",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="Tokenizer to ship (name or path, 'embedded'; 'none' for no tokenizer files). Default: the one "
        "the checkpoint records.",
    )
    p.add_argument("--dtype", default=None, help="Cast the weights first, e.g. bfloat16 (default: as saved).")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m bhyt_pl export``; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bhyt_pl.checkpoint import load_model
    from bhyt_pl.errors import UsageError

    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {args.out!r} is a file; give a folder (new or empty)")
    existing = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if existing and not args.overwrite:  # before any work: the user's files are never replaced silently
        shown = ", ".join(existing[:3]) + (", ..." if len(existing) > 3 else "")
        raise UsageError(
            f"--out {args.out!r} is not empty ({len(existing)} entries: {shown}); choose a new folder, or pass "
            f"--overwrite to replace the files the export writes (other files are kept)"
        )

    dtype = None
    if args.dtype is not None:
        dtype = getattr(torch, args.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"--dtype must name a torch dtype such as 'float32' or 'bfloat16', got {args.dtype!r}")
    loaded = load_model(args.ckpt_path, dtype=dtype)
    tokenizer = args.tokenizer or loaded.tokenizer
    if tokenizer is not None and tokenizer.lower() == "none":
        tokenizer = None
    out = save_hf(loaded.model, args.out, tokenizer)
    kind = "LlamaForCausalLM" if stock_llama_compatible(loaded.model) else "generated modeling code (trust_remote_code)"
    print(f"exported {loaded.config.norm!r} model to {out} as {kind}" + ("" if tokenizer else ", without a tokenizer"))
    return 0
