"""Quantize a loaded float model's linear layers at load (``quantization="int8"`` / ``"int4"``),
and describe any model's weights (format and bytes) for ``engine.stats()``.

Every ``nn.Linear`` whose input width is a multiple of 32, the LM head included, becomes a
:class:`~langchain_ascend.quant.linear.QuantizedLinear` rounded to nearest per block of 32
(``formats.quantize``); a head tied to the token embedding also replaces the embedding with a
:class:`~langchain_ascend.quant.embedding.QuantizedEmbedding` over the same blocks, so the table
is held once, quantized.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from langchain_ascend.quant import formats

logger = logging.getLogger(__name__)

FORMAT_OF_MODE = {"int8": "q8_0", "int4": "q4_1"}
"""The block format each at-load quantization mode uses."""


def quantize_model(model: Any, fmt: str) -> list[str]:
    """Replace ``model``'s linear layers (and a tied embedding) by ``fmt`` blocks, in place.

    Args:
        model: A transformers causal LM on the CPU (any float dtype).
        fmt: One of ``formats.FORMATS``.

    Returns:
        The names of the replaced linear layers.

    Raises:
        QuantizationError: ``fmt`` is not a known format.
    """
    import torch

    from langchain_ascend.quant.embedding import QuantizedEmbedding
    from langchain_ascend.quant.linear import replace_linears

    formats.check_format(fmt)
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = (isinstance(head, torch.nn.Linear) and isinstance(embedding, torch.nn.Embedding)
            and head.weight is embedding.weight)
    skipped = []

    def plan(name: str, layer: torch.nn.Linear) -> formats.QuantizedWeight | None:
        if layer.in_features % formats.BLOCK_SIZE:
            skipped.append(name)
            return None
        return formats.quantize(layer.weight.detach(), fmt)

    replaced = replace_linears(model, plan)
    new_head = model.get_output_embeddings()
    if tied and new_head is not head:
        dtype = embedding.weight.dtype
        modules = dict(model.named_modules())
        embed_name = next(name for name, module in modules.items() if module is embedding)
        parent, _, child = embed_name.rpartition(".")
        setattr(model.get_submodule(parent), child,
                QuantizedEmbedding.replacing(embedding, new_head.qweight, dtype=dtype))
    if skipped:
        logger.info("kept %d linear layers float (input width not a multiple of %d): %s",
                    len(skipped), formats.BLOCK_SIZE, ", ".join(skipped[:5]))
    logger.info("quantized %d linear layers to %s at load", len(replaced), fmt)
    return replaced


def weight_summary(model: Any) -> dict[str, Any]:
    """What the model's weights are: ``{"format": "q4_1+q8_0" | "float32" | "bfloat16"...,
    "bytes": all weights (shared blocks and tied parameters once), "quantized_bytes": the
    blocks' share, "linear_formats": {format or dtype: number of linear layers}}``."""
    import torch

    from langchain_ascend.quant.linear import QuantizedLinear, quantized_weight_bytes

    counts: Counter[str] = Counter()
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            counts[module.fmt] += 1
        elif isinstance(module, torch.nn.Linear):
            counts[str(module.weight.dtype).removeprefix("torch.")] += 1
    blocks = quantized_weight_bytes(model)
    floats = sum(p.numel() * p.element_size() for p in model.parameters())  # unique params
    quantized = [fmt for fmt, _ in counts.most_common() if fmt in formats.FORMATS]
    if quantized:
        label = "+".join(quantized)
    else:
        first = next(model.parameters(), None)
        label = "float" if first is None else str(first.dtype).removeprefix("torch.")
    return {"format": label, "bytes": int(blocks + floats), "quantized_bytes": int(blocks),
            "linear_formats": dict(counts)}
