"""bhyt_pl's ``Llama`` as a Hugging Face ``transformers`` causal LM, for every norm scheme.

This module is the template of the modeling file an export ships (``bhyt_pl.convert.save_hf``): the
export copies these classes together with the source of every ``bhyt_pl`` definition they use
(``bhyt_pl.source_bundle``), so the exported model runs the package's own ``Llama``, blocks and norms
without importing ``bhyt_pl``. The Hugging Face side is a thin shell:

- ``BHyTLlamaConfig`` stores the ``LlamaConfig`` fields as plain data (``config.bhyt``) next to the
  usual Hugging Face names (``hidden_size``, ``num_hidden_layers``, ...);
- ``BHyTLlamaForCausalLM`` wraps the ``Llama`` (weights under ``model.``), adapts transformers' KV
  cache to the model's cache interface, so ``generate`` decodes with a cache, and recomputes
  weight-derived norm constants (BHyT's ``c``) after ``from_pretrained`` (transformers loads weights
  without ``load_state_dict``, so the model's post-load hook does not run). An exported model is a finished
  model: its ``c`` is the one its weights give, as a refresh at the exported step would set it, not the
  value the training run was still using since its last scheduled refresh (which ``bhyt_pl.load_model``
  restores from a training checkpoint).

Inputs must be unpadded: an ``attention_mask`` with zeros (left-padded batched generation) is refused,
since the model's attention takes no padding mask; right padding without a mask, as lm-eval's
log-likelihood batches use, is harmless under causal attention.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from bhyt_pl.config import LlamaConfig
from bhyt_pl.hf_config import to_hf_fields
from bhyt_pl.model import Llama, prefix_attention_mask

__all__ = ["BHyTLlamaConfig", "BHyTLlamaForCausalLM", "TransformersCacheView"]

# the output's cache field: ``cache`` from transformers 5.2x, ``past_key_values`` before
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class BHyTLlamaConfig(PretrainedConfig):
    """A ``LlamaConfig`` (``bhyt``, plain data) with the Hugging Face names tools read derived from it.

    Args:
        bhyt: the ``LlamaConfig`` fields (``dataclasses.asdict``); defaults when None.
        **kwargs: ``PretrainedConfig`` arguments (token ids, ``auto_map``, ...).
    """

    model_type = "bhyt_llama"

    def __init__(self, bhyt: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = LlamaConfig(**(bhyt or {}))
        derived = to_hf_fields(config)
        for key in derived:
            kwargs.pop(key, None)  # written by a previous save: always derived again from ``bhyt``
        kwargs["tie_word_embeddings"] = derived.pop("tie_word_embeddings")
        use_cache = kwargs.pop("use_cache", True)
        super().__init__(**kwargs)
        self.bhyt = config.to_dict()
        self.use_cache = use_cache
        for key, value in derived.items():
            setattr(self, key, value)


class TransformersCacheView:
    """The model's KV-cache interface (``update(layer, start, k, v)``) over a transformers ``Cache``,
    which appends per layer and returns every cached key and value."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(k, v, layer)

    def attention_mask(self, start: int, length: int, device: torch.device) -> tuple[torch.Tensor | None, bool]:
        return prefix_attention_mask(start, length, device)  # the cache returns exactly the filled positions


class BHyTLlamaForCausalLM(PreTrainedModel, GenerationMixin):
    """The bhyt_pl ``Llama`` behind transformers' causal-LM interface (``logits``, ``loss`` from
    ``labels``, ``past_key_values``, ``generate``)."""

    config_class = BHyTLlamaConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _supports_sdpa = True

    def __init__(self, config: BHyTLlamaConfig) -> None:
        super().__init__(config)
        self.model = Llama(LlamaConfig(**config.bhyt))
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        # ``Llama`` initialises itself with the package's init policy when built off the meta device;
        # from_pretrained fills every weight from the file. Weight-derived constants are recomputed
        # in ``from_pretrained``, after the weights are in.
        return

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True
        model.model.refresh_norm_constants()
        return loaded

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> torch.nn.Module | None:
        return self.model.lm_head  # None when tied: the output reads the embedding matrix directly

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Logits [B, T, V] for ``input_ids`` [B, T] after the prefix held in ``cache`` (a transformers
        ``Cache``; ``past_key_values`` before transformers 5).

        ``labels`` [B, T] (-100 ignored) give the mean next-token loss, shifted inside as in transformers.
        """
        B, T = input_ids.shape
        past = cache if cache is not None else kwargs.pop("past_key_values", None)
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "this exported bhyt_pl model takes unpadded inputs only (attention_mask has zeros); "
                "generate or score one sequence at a time, or batches of equal length"
            )
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past is None:
            past = DynamicCache(config=self.config)
        start = past.get_seq_length() if past is not None else 0
        if position_ids is not None:
            expected = torch.arange(start, start + T, device=position_ids.device).expand(B, T)
            if not torch.equal(position_ids, expected):
                raise ValueError(f"position_ids must be consecutive from the cache length {start} (no padding)")
        view = TransformersCacheView(past) if past is not None else None
        logits = self.model(input_ids, cache=view, start_pos=start)  # [B, T, V]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device), ignore_index=-100
            )
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: past if use_cache else None})
