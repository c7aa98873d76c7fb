"""Quantized linear weights (issue 23).

- ``formats``: GGUF's Q4_0 / Q4_1 / Q8_0 blocks (:class:`QuantizedWeight`), quantize and
  de-quantize in pure torch.

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
