"""Pure-decode steps of a prepared Llama-style model through ONE native call for all layers.

With every decoder layer lean (``engine.cpu.lean_layer``), a decode step still runs about ten
kernels per layer from Python; on a small CPU the interpreter and dispatch time between them
is a few milliseconds per step, a third of a batch-1 step of a 30-layer model. The decoder
model's (``LlamaModel`` etc.) ``forward`` is swapped for one that, on a pure-decode step the
native stack can take, embeds the tokens, computes the rotary tables (the model's own
modules), runs every layer in ``native.decode_stack`` and applies the final norm; any other
call -- prefills, mixed steps, a shared-prefix step the CPU backend attends with its shared
kernel, more rows than the native products take, plain transformers use -- runs the class's
forward (the per-op lean path).

The stack reads the same tiles, norms and caches as the per-op path and runs the same kernels,
so its values are the per-op path's up to the SiLU's exponential and, for one float32 row, the
order of the product's sums (``decode_stack.c``); tests compare the two.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from langchain_ascend.attention import registry
from langchain_ascend.engine.cpu.lean_attention import sliding_window
from langchain_ascend.engine.cpu.swap import swap_forward, swapped_by
from langchain_ascend.native import decode_stack, paged_attention

logger = logging.getLogger(__name__)

STACK_MODELS = frozenset({"LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model"})
"""Decoder classes whose forward is: embed, rotary tables, the layers, the final norm."""


def _tiles(linear: Any, dtype: Any) -> Any:
    """The ``(N/8, K, 8)`` tiles copy the native products read for ``linear``, or None."""
    import torch

    return getattr(linear, "bf16_tiles" if dtype == torch.bfloat16 else "f32_tiles", None)


def _ptr(tensor: Any) -> int | None:
    return None if tensor is None else tensor.data_ptr()


@dataclass
class NativeDecodeStack:
    """The native stack of one model: its layers' kernel records and the step rule.

    Attributes:
        dtype: The model's dtype (float32 or bfloat16).
        layers: One :class:`~langchain_ascend.native.decode_stack.DecodeLayer` per layer
            (cache pointers filled on the first step, from the step's caches).
        modules: The decoder layers, in order.
        max_rows: Most rows of a step (every product's native row limit).
        geometry: ``(heads, kv_heads, head_dim, intermediate)``.
        keep: The tensors the records point at (kept alive here).
    """

    dtype: Any
    layers: Any
    modules: list[Any]
    max_rows: int
    geometry: tuple[int, int, int, int]
    keep: list[Any] = field(default_factory=list)
    _caches: Any = None
    _scratch: Any = None

    @classmethod
    def for_model(cls, decoder: Any) -> NativeDecodeStack | None:
        """The stack of ``decoder`` (a prepared ``LlamaModel``-like module), or None where it
        does not apply (another class, a layer that is not lean, a product without tiles,
        the kernel not built here)."""
        import torch

        layers = list(getattr(decoder, "layers", []))
        if (type(decoder).__name__ not in STACK_MODELS or not layers
                or not decode_stack.available()
                or any(swapped_by(layer) != "lean_layer" for layer in layers)):
            return None
        dtype = next(decoder.parameters()).dtype
        if dtype not in (torch.float32, torch.bfloat16):
            return None
        first = layers[0].self_attn
        heads = first.config.num_attention_heads
        kv_heads = first.config.num_key_value_heads
        head_dim, intermediate = first.head_dim, layers[0].mlp.lean_gate_up.sizes[0]
        records, keep, max_rows = [], [], None
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, gate_up = attn.lean_qkv.linear, mlp.lean_gate_up.linear
            products = (qkv, attn.o_proj, gate_up, mlp.down_proj)
            tiles = [_tiles(linear, dtype) for linear in products]
            if any(t is None for t in tiles) or mlp.lean_gate_up.sizes != [intermediate] * 2:
                return None
            limit = min(int(getattr(linear, "native_max_rows", 0)) for linear in products)
            max_rows = limit if max_rows is None else min(max_rows, limit)
            norms = (attn.q_norm, attn.k_norm) if attn.lean_head_norms else (None, None)
            record = decode_stack.DecodeLayer(
                norm1=_ptr(layer.input_layernorm.weight),
                norm2=_ptr(layer.post_attention_layernorm.weight),
                qkv_tiles=_ptr(tiles[0]), qkv_bias=_ptr(qkv.bias),
                q_norm=_ptr(None if norms[0] is None else norms[0].weight),
                k_norm=_ptr(None if norms[1] is None else norms[1].weight),
                o_tiles=_ptr(tiles[1]), o_bias=_ptr(attn.o_proj.bias),
                gu_tiles=_ptr(tiles[2]), gu_bias=_ptr(gate_up.bias),
                down_tiles=_ptr(tiles[3]), down_bias=_ptr(mlp.down_proj.bias), kv_cache=None,
                eps1=layer.input_layernorm.variance_epsilon,
                eps2=layer.post_attention_layernorm.variance_epsilon,
                head_eps=norms[0].variance_epsilon if norms[0] is not None else 0.0,
                scale=attn.scaling, window=sliding_window(attn) or 0)
            records.append(record)
            keep.extend(tiles)
        array = (decode_stack.DecodeLayer * len(records))(*records)
        return cls(dtype=dtype, layers=array, modules=layers, max_rows=max_rows or 0,
                   geometry=(heads, kv_heads, head_dim, intermediate), keep=keep)

    def takes(self, step: Any, input_ids: Any) -> bool:
        """Whether this call is a pure-decode step the stack runs: the CPU backend's paged
        path for every row (not its shared-prefix path), at most :attr:`max_rows` rows."""
        metadata = getattr(step, "metadata", None)
        decodes = getattr(metadata, "decodes", None)
        return (decodes is not None and not metadata.prefills and decodes.paged is not None
                and input_ids is not None and input_ids.dim() == 2 and input_ids.shape[0] == 1
                and 0 < input_ids.shape[1] == decodes.num_decodes <= self.max_rows)

    def run(self, hidden: Any, cos: Any, sin: Any, step: Any) -> None:
        """Every layer on ``hidden`` ``(M, D)`` in place, writing the step's K/V."""
        import torch

        caches = step.kv_caches
        if self._caches is not caches:  # the runner's caches: fixed for its lifetime
            for record, module in zip(self.layers, self.modules, strict=True):
                record.kv_cache = caches[int(module.self_attn.layer_idx)].data_ptr()
            self._caches = caches
        rows, size = hidden.shape
        heads, kv_heads, head_dim, intermediate = self.geometry
        need = decode_stack.scratch_elements(rows, size, heads, kv_heads, head_dim,
                                             intermediate)
        if self._scratch is None or self._scratch.numel() < need:
            self._scratch = torch.empty(need, dtype=self.dtype)
        decodes = step.metadata.decodes
        block_tables, seq_lens = decodes.paged
        cache = caches[0]  # (2, KVH, NB, BS, Dh), the same shape for every layer
        splits = paged_attention.num_splits(rows * kv_heads, max(decodes.seq_lens),
                                            torch.get_num_threads())
        decode_stack.run_stack(
            self.layers, hidden, cos, sin, step.metadata.slot_mapping, block_tables, seq_lens,
            heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
            num_blocks=cache.shape[2], block_size=cache.shape[3], num_splits=splits,
            scratch=self._scratch)


def _stack_forward(self: Any, input_ids: Any = None, attention_mask: Any = None,
                   position_ids: Any = None, past_key_values: Any = None,
                   inputs_embeds: Any = None, use_cache: Any = None, **kwargs: Any) -> Any:
    stack = swapped_by(self)
    step = kwargs.get(registry.STEP_KWARG)
    if (past_key_values is not None or inputs_embeds is not None or position_ids is None
            or not stack.takes(step, input_ids)):
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, past_key_values=past_key_values,
                                  inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    from transformers.modeling_outputs import BaseModelOutputWithPast

    embeds = self.embed_tokens(input_ids)  # (1, M, D)
    cos, sin = self.rotary_emb(embeds, position_ids)  # (1, M, Dh) each
    hidden = embeds[0].contiguous()  # (M, D), updated in place by the stack
    stack.run(hidden, cos[0].contiguous(), sin[0].contiguous(), step)
    return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden[None]))  # (1, M, D)


def native_decode_stack(model: Any) -> int:
    """Give ``model``'s decoder the native-stack forward where :meth:`NativeDecodeStack.
    for_model` applies (after the other CPU preparations).

    Returns:
        How many layers the stack runs (0: not applied).
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    stack = None if decoder is None else NativeDecodeStack.for_model(decoder)
    if stack is None:
        return 0
    swap_forward(decoder, _stack_forward, stack)
    logger.info("native decode stack over %d layers, up to %d rows", len(stack.modules),
                stack.max_rows)
    return len(stack.modules)
