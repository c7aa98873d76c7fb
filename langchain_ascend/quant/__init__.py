"""Quantized linear weights (issue 23).

- ``formats``: GGUF's Q4_0 / Q4_1 / Q8_0 blocks (:class:`QuantizedWeight`), quantize and
  de-quantize in pure torch, and the Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K blocks read from files
  (de-quantized bit for bit as gguf-py);
- ``linear`` / ``embedding``: ``QuantizedLinear`` and ``QuantizedEmbedding`` (weights kept as
  blocks), ``replace_linears``;
- ``device_matmul``: the blocks as NPU (``npu_weight_quant_batchmatmul``) and CUDA
  (``_weight_int4pack_mm``) weight-only products, converted once per layer;
- ``gguf_file`` / ``gguf_config`` / ``gguf_model``: the package's one GGUF reader (header once,
  tensors as views of the file's map), its transformers config, and the model built from its
  blocks (``load_gguf_model``);
- ``quantize_model``: ``int8`` / ``int4`` at load for float models, ``weight_summary``;
- ``load``: the model runner's loader for every ``quantization`` mode.

The native products that run the blocks as they are live in ``langchain_ascend.native.
qmatmul``.
"""

from langchain_ascend.quant.formats import (
    BLOCK_SIZE,
    FORMATS,
    GGML_TYPES,
    QuantizedWeight,
    bytes_per_block,
    concatenate,
    dequantize,
    nbytes,
    quantize,
)

__all__ = ["BLOCK_SIZE", "FORMATS", "GGML_TYPES", "QuantizedWeight", "bytes_per_block",
           "concatenate", "dequantize", "nbytes", "quantize"]
