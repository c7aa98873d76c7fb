"""The CPU decoder: the pure-decode steps of a known family, run natively by one object.

:class:`CpuDecoder` is built once, by ``engine.cpu.prepare``, from the prepared HF model and
the decoder layers the lean path prepared (``engine.cpu.lean_layer``: their products laid out
by ``engine.cpu.weight_layout`` -- float32 or bfloat16 tiles -- or held as GGUF blocks by
``quant.linear.QuantizedLinear``, int8 and int4 included). It owns the whole decode step:

* the token embedding and the rotary tables (the model's own modules),
* the packed per-layer weights, norms and paged-attention call of every layer, run in ONE
  native call (``engine.cpu.packed_layers`` over ``native.stack_kernel``),
* the final norm and the LM head (a quantized head runs ``native.qmatmul`` through its own
  forward; the screened greedy head, ``engine.cpu.greedy_head``, reads the hidden rows this
  decoder returns).

The model runner (``engine.worker.model_runner``) asks :meth:`CpuDecoder.can_run` for every
eager step and calls :meth:`CpuDecoder.hidden` / :meth:`CpuDecoder.logits` for the steps it
can run: pure-decode steps on the CPU backend's paged path (shared prefixes and speculative
verify passes, which are packed as decode rows, included) of at most the products' native
row limit. Every other step -- prefills, mixed steps, more rows, the compiled static step,
plain transformers calls -- runs the HF forward with our attention (sped up per op by the
lean and fused module forwards ``prepare`` installed, ``engine.cpu.swap``). No module's
``forward`` leads here: the decoder module keeps its class forward.

A family the decoder does not own (``langchain_ascend.families``: Gemma 2/3, Phi-3...), a layer
the lean path did not prepare or a product the stack cannot read gets no decoder (:meth:`build`
returns None, and logs why) and runs the HF forward: its quantized linears are still
``QuantizedLinear`` modules computing from their blocks, so the output is the model's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from langchain_ascend import families
from langchain_ascend.engine.cpu.packed_layers import PackedLayers

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class CpuDecoder:
    """One model's native decode step (module docstring).

    Args:
        decoder: The HF decoder module (``LlamaModel`` etc.): its embedding, rotary embedding
            and final norm are called as they are.
        head: The model's LM head (``model.get_output_embeddings()``).
        stack: The packed layers of every decoder layer, in order.

    Attributes:
        stack: The packed layers (``max_rows``: most rows of a step it takes).
    """

    def __init__(self, decoder: Any, head: Any, stack: PackedLayers) -> None:
        self.embed_tokens = decoder.embed_tokens
        self.rotary_emb = decoder.rotary_emb
        self.norm = decoder.norm
        self.head = head
        self.stack = stack

    @classmethod
    def build(cls, model: Any, lean_layers: list[Any]) -> CpuDecoder | None:
        """The decoder of ``model`` whose ``lean_layers`` (the layers ``lean_layer`` prepared)
        are all of its decoder layers, or None where it does not apply (module docstring)."""
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if (decoder is None or type(decoder).__name__ not in families.NATIVE_DECODER_CLASSES
                or model_type not in families.NATIVE_MODEL_TYPES):
            logger.info("no native CPU decoder for a %s model (%s): transformers' forward runs "
                        "every step", model_type, type(decoder).__name__)
            return None
        config = model.config
        layers = list(decoder.layers)
        prepared = {id(layer) for layer in lean_layers}
        if (len(layers) != config.num_hidden_layers
                or not all(id(layer) in prepared for layer in layers)):
            return None
        stack = PackedLayers.for_layers(layers)
        if stack is None:
            return None
        logger.info("native CPU decoder over %d layers, up to %d rows", len(layers),
                    stack.max_rows)
        return cls(decoder, model.get_output_embeddings(), stack)

    @property
    def num_layers(self) -> int:
        """How many layers the native stack runs."""
        return len(self.stack.modules)

    def can_run(self, input_ids: torch.Tensor, step: Any) -> bool:
        """Whether the step of ``input_ids`` ``(1, T)`` with the paged attention ``step`` is
        one this decoder runs (a pure-decode step the stack takes)."""
        return self.stack.takes(step, input_ids)

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
               step: Any) -> torch.Tensor:
        """``(1, T, D)`` final-normed hidden states of a step :meth:`can_run` accepted
        (``input_ids``, ``position_ids`` ``(1, T)``), writing every layer's K/V."""
        embeds = self.embed_tokens(input_ids)  # (1, T, D)
        cos, sin = self.rotary_emb(embeds, position_ids)  # (1, T, Dh) each
        hidden = embeds[0].contiguous()  # (T, D), updated in place by the stack
        self.stack.run(hidden, cos[0].contiguous(), sin[0].contiguous(), step)
        return self.norm(hidden[None])  # (1, T, D)

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``(S, V)`` logits of the ``rows`` ``(S,)`` of ``hidden`` ``(1, T, D)``: the LM head
        on those rows only, as the causal LM's ``logits_to_keep`` does."""
        return self.head(hidden[:, rows])[0]  # (S, V)
