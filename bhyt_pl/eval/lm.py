"""``BHyTLM``: lm-evaluation-harness's ``TemplateLM`` around an in-memory bhyt_pl ``Llama``.

DyT and BHyT have no Hugging Face architecture, so the model is evaluated directly rather than
converted for lm-eval's ``hf`` model; the adapter works for every registered norm scheme.

BOS handling (the same layout the C4 data module trains on: every document starts with BOS):
- ``tok_encode(text)`` encodes without the tokenizer's own special tokens and prepends one BOS, unless
  the text already starts with it (a chat-templated prompt does); ``add_special_tokens=False`` gives
  the bare ids.
- ``loglikelihood``: the context is encoded with its BOS and the continuation is the rest of the
  encoding of ``context + continuation`` (lm-eval's ``_encode_pair``); an empty context becomes
  ``[BOS]`` (``prefix_token_id``).
- ``loglikelihood_rolling``: lm-eval's rolling windows over the bare ids with BOS as the prefix token,
  so the first token is predicted from BOS and no EOS is scored.
- ``generate_until``: the context is encoded with BOS.

Sequences longer than ``max_length`` (``config.max_seq_len`` by default) lose tokens on the left.

Example:
    >>> from bhyt_pl.eval import BHyTLM
    >>> lm = BHyTLM.from_checkpoint("runs/tiny-bhyt/version_0/checkpoints/last.ckpt")  # doctest: +SKIP
    >>> import lm_eval
    >>> lm_eval.simple_evaluate(lm, tasks=["arc_easy"], num_fewshot=3)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tokenizers import Tokenizer
from tqdm import tqdm

from bhyt_pl.data.chat import ChatTemplate, render_chat
from bhyt_pl.data.tokenizer import EMBEDDED, SpecialTokens, load_tokenizer
from bhyt_pl.eval.scoring import score_rows
from bhyt_pl.model import Llama

__all__ = ["BHyTLM"]

log = logging.getLogger(__name__)

DEFAULT_MAX_GEN_TOKS = 256


def _flag(name: str, value: bool | str) -> bool:
    """A boolean model argument; lm-eval's ``--model_args`` may hand it over as text."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


@register_model("bhyt_pl")
class BHyTLM(TemplateLM):
    """lm-eval model for a bhyt_pl ``Llama`` of any norm scheme (registered as ``bhyt_pl``).

    Args:
        model: the model; it is put in eval mode and moved to ``device``.
        tokenizer: a ``tokenizers.Tokenizer`` or a name/path for ``load_tokenizer`` (``"embedded"``).
        batch_size: sequences per forward pass for log-likelihoods (``"auto"`` means 16).
        device: where to run (default: where the model is).
        max_length: longest sequence fed to the model (default and maximum ``config.max_seq_len``).
        chat_template: the ``ChatTemplate`` used when lm-eval applies a chat template
            (``--apply_chat_template``); the LIMA data module's default when None.
        name: model name reported by lm-eval (checkpoint path when built from one).
        compile: decode generation tasks with ``Llama.generate(compile=True)`` (one compiled decode
            step over a static cache; greedy outputs equal eager). Log-likelihoods stay eager: each is
            one forward pass of a new shape. ``--model_args ...,compile=True``.
    """

    def __init__(
        self,
        model: Llama,
        tokenizer: Tokenizer | str = EMBEDDED,
        batch_size: int | str = 16,
        device: str | torch.device | None = None,
        max_length: int | None = None,
        chat_template: ChatTemplate | None = None,
        name: str = "bhyt_pl",
        compile: bool | str = False,
    ) -> None:
        super().__init__()
        if not isinstance(model, Llama):
            raise TypeError(f"model must be a bhyt_pl.model.Llama, got {type(model).__name__}")
        if isinstance(batch_size, str):
            batch_size = 16 if batch_size.startswith("auto") else int(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        limit = model.config.max_seq_len
        if max_length is not None and not 2 <= int(max_length) <= limit:
            raise ValueError(f"max_length must be in [2, config.max_seq_len={limit}], got {max_length}")
        if device is not None:
            model = model.to(device)
        self.model = model.eval()
        self.tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.tokenizer_id = tokenizer if isinstance(tokenizer, str) else "tokenizers.Tokenizer"
        self.special = SpecialTokens.from_tokenizer(self.tok)
        self.batch_size = batch_size
        self.max_length = int(max_length) if max_length is not None else limit
        self.template = chat_template or ChatTemplate()
        self.name = name
        self.compile = _flag("compile", compile)

    # ----------------------------------------------------------------------------- construction
    @classmethod
    def from_checkpoint(
        cls,
        ckpt_path: str | Path,
        tokenizer: Tokenizer | str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        **kwargs: Any,
    ) -> BHyTLM:
        """Rebuild a ``LlamaLM`` checkpoint's model (``bhyt_pl.checkpoint.load_model``) and wrap it.

        ``tokenizer`` defaults to the one the checkpoint records (the embedded one if it records none).
        """
        from bhyt_pl.checkpoint import load_model

        if isinstance(dtype, str):
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ValueError(f"dtype must name a torch dtype such as 'float32' or 'bfloat16', got {dtype!r}")
            dtype = getattr(torch, dtype)
        loaded = load_model(ckpt_path, map_location=device, dtype=dtype)
        tokenizer = tokenizer or loaded.tokenizer or EMBEDDED
        return cls(loaded.model, tokenizer, device=device, name=str(ckpt_path), **kwargs)

    _ARGS = ("ckpt_path", "tokenizer", "device", "dtype", "batch_size", "max_length", "compile")

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> BHyTLM:
        """``lm_eval --model bhyt_pl --model_args ckpt_path=...[,tokenizer=,dtype=,max_length=,compile=True]``."""
        args = {**{k: v for k, v in (additional_config or {}).items() if v is not None}, **dict(arg_dict)}
        args.pop("max_batch_size", None)  # no automatic batch sizing: batch_size is used as given
        unknown = sorted(set(args) - set(cls._ARGS))
        if unknown or "ckpt_path" not in args:
            raise ValueError(
                f"bhyt_pl model_args need ckpt_path and accept {', '.join(cls._ARGS)}; "
                f"got unknown {unknown}" + ("" if "ckpt_path" in args else " and no ckpt_path")
            )
        ckpt_path = args.pop("ckpt_path")
        device = str(args.get("device") or "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():  # lm-eval's CLI defaults to cuda
            log.warning("device %r requested but CUDA is not available: evaluating on cpu", device)
            args["device"] = "cpu"
        return cls.from_checkpoint(ckpt_path, **args)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> BHyTLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ----------------------------------------------------------------------------- tokens
    @property
    def eot_token_id(self) -> int:
        return self.special.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.special.bos_id  # documents start with BOS in pretraining (C4DataModule)

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        ids = self.tok.encode(string, add_special_tokens=False).ids
        if add_special_tokens is False or (ids and ids[0] == self.special.bos_id):
            return ids
        return [self.special.bos_id, *ids]

    def tok_decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    # ----------------------------------------------------------------------------- scoring
    def _row(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        if not continuation:
            raise ValueError("empty continuation: nothing to score")
        if len(continuation) > self.max_length:
            raise ValueError(f"continuation of {len(continuation)} tokens exceeds max_length={self.max_length}")
        whole = (context + continuation)[-(self.max_length + 1) :]  # left-truncate
        return whole[:-1], continuation

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        rows = [self._row(list(context), list(continuation)) for _, context, continuation in requests]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # length-sorted across chunks too
        scored: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        step = self.batch_size * 8  # progress granularity
        for start in tqdm(range(0, len(order), step), disable=disable_tqdm or len(order) <= step, desc="loglikelihood"):
            chunk = order[start : start + step]
            for i, result in zip(chunk, score_rows(self.model, [rows[i] for i in chunk], self.batch_size)):
                scored[i] = result
        for (key, _, _), result in zip(requests, scored):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return scored

    def rolling_windows(self, text: str) -> list[tuple[list[int], list[int]]]:
        """lm-eval's disjoint rolling windows over ``text``'s ids, BOS as the prefix token."""
        ids = self.tok_encode(text, add_special_tokens=False)
        windows = get_rolling_token_windows(
            token_list=ids, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1
        )
        return [make_disjoint_window(w) for w in windows]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        windows = [self.rolling_windows(text) for text in texts]
        flat = [(None, ctx, cont) for ws in windows for ctx, cont in ws]
        scores = iter(self._loglikelihood_tokens(flat, disable_tqdm=disable_tqdm))
        results = []
        for text, ws in zip(texts, windows):
            total = sum(next(scores)[0] for _ in ws)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            results.append(total)
        return results

    # ----------------------------------------------------------------------------- generation
    def _generate(self, context: list[int], until: list[str], max_gen_toks: int, temperature: float) -> str:
        """Greedy (or sampled) decoding with ``Llama.generate`` until a stop string, EOS/EOT or the budget."""
        budget = max(1, min(max_gen_toks, self.max_length - 1))
        context = context[-(self.max_length - budget) :]  # left-truncate so the answer fits
        stop_ids = [self.special.eos_id] + ([self.special.eot_id] if self.special.eot_id is not None else [])
        n0 = len(context)

        def reached_stop_string(tokens: torch.Tensor) -> bool:  # tokens: [1, n0 + k]
            text = self.tok_decode(tokens[0, n0:].tolist())
            return any(s and s in text for s in until)

        prompt = torch.tensor([context], device=self.device)
        out = self.model.generate(
            prompt, budget, temperature, eos_id=stop_ids, stop=reached_stop_string, compile=self.compile
        )
        out = out[0, n0:].tolist()
        if out and out[-1] in stop_ids:  # a stop token ends the answer and is not part of it
            out = out[:-1]
        text = self.tok_decode(out)
        cut = min((text.index(s) for s in until if s and s in text), default=len(text))
        return text[:cut]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        results = []
        for req in tqdm(requests, disable=disable_tqdm, desc="generate_until"):
            context, gen_kwargs = req.args
            kwargs = dict(gen_kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen_toks = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            do_sample = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 0.0)) if do_sample else 0.0
            if kwargs:
                log.debug("generate_until ignores generation kwargs %s", sorted(kwargs))
            text = self._generate(self.tok_encode(context), until, max_gen_toks, temperature)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            results.append(text)
        return results

    # ----------------------------------------------------------------------------- chat
    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer_id.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return repr(self.template) if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return render_chat(chat_history, self.template, add_generation_prompt)

    def get_model_info(self) -> dict[str, Any]:
        config = self.model.config
        return {"model_name": self.name, "norm": config.norm, "max_length": self.max_length, "compile": self.compile}
