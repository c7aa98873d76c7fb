"""Load a model folder the way its ``quantization`` setting asks: the model runner's one call.

Modes (:data:`QUANTIZATION_MODES`):

- ``"auto"``: ``"gguf"`` for a folder whose weights are in a GGUF file
  (``engine.model_source.gguf_blocks``), ``"none"`` for any other folder;
- ``"gguf"``: run the GGUF file's own blocks (``quant.gguf_model``);
- ``"int8"`` / ``"int4"``: every linear layer (LM head included) in ``q8_0`` / ``q4_1``: from the
  GGUF file's values, or quantized at load from an HF folder's float weights
  (``quant.quantize_model``);
- ``"none"`` (or None): float weights; a GGUF-backed folder is de-quantized from the file.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from langchain_ascend.engine.model_source.gguf_blocks import gguf_weights_file
from langchain_ascend.quant.gguf_model import load_gguf_model
from langchain_ascend.quant.quantize_model import FORMAT_OF_MODE, quantize_model

logger = logging.getLogger(__name__)

QUANTIZATION_MODES = ("auto", "gguf", "int8", "int4", "none")


def check_quantization(quantization: str | None) -> str:
    """``quantization`` as one of :data:`QUANTIZATION_MODES` (None is ``"none"``).

    Raises:
        ValueError: Any other value.
    """
    mode = "none" if quantization is None else quantization
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {QUANTIZATION_MODES} or None, got "
                         f"{quantization!r}")
    return mode


def resolve_quantization(quantization: str | None, *, from_gguf: bool) -> str:
    """The concrete mode (``"gguf"``, ``"int8"``, ``"int4"`` or ``"none"``) for a model whose
    weights are (``from_gguf``) or are not in a GGUF file.

    Raises:
        ValueError: An unknown mode, or ``"gguf"`` for a model without a GGUF file.
    """
    mode = check_quantization(quantization)
    if mode == "auto":
        return "gguf" if from_gguf else "none"
    if mode == "gguf" and not from_gguf:
        raise ValueError("quantization='gguf' runs a GGUF file's own blocks, and this model is "
                         "an HF folder; expected a .gguf model, or quantization='int8' / "
                         "'int4' / None")
    return mode


def load_causal_lm(model_path: str | os.PathLike[str], *, dtype: Any,
                   quantization: str | None = "auto",
                   attn_implementation: str | None = None, config: Any = None,
                   skeleton: Any = None) -> tuple[Any, str]:
    """The causal LM of ``model_path`` on the CPU, in ``dtype``, its weights as ``quantization``
    asks.

    Args:
        model_path: An HF folder, or a GGUF-backed folder (``gguf_blocks``).
        dtype: The model dtype.
        quantization: One of :data:`QUANTIZATION_MODES` or None.
        attn_implementation: Passed to ``from_pretrained`` for an HF folder (a GGUF model
            gets the default; the runner switches it).
        config: A GGUF-backed folder's config (default: ``AutoConfig`` reads it).
        skeleton: For a GGUF-backed folder: the module tree to fill
            (``quant.gguf_model.load_gguf_model``); default transformers' model class.

    Returns:
        ``(model, mode)``: the model in eval mode and the concrete mode it was loaded in.

    Raises:
        ValueError: As for :func:`resolve_quantization`.
        ModelSourceError: A GGUF-backed folder whose file is gone or unreadable.
    """
    gguf_file = gguf_weights_file(model_path)
    mode = resolve_quantization(quantization, from_gguf=gguf_file is not None)
    if gguf_file is not None:
        if config is None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(os.fspath(model_path))
        model, _ = load_gguf_model(gguf_file, quantization=mode, dtype=dtype, config=config,
                                   skeleton=skeleton)
        return model, mode
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(os.fspath(model_path), **kwargs)
    if mode in FORMAT_OF_MODE:
        quantize_model(model, FORMAT_OF_MODE[mode])
    return model.eval(), mode
