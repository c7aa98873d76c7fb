"""A transformers causal LM built straight from a GGUF file, its blocks kept as they are.

:func:`load_gguf_model` reads the file's tensor table (``gguf_file``), builds the model's
skeleton with empty weights, and fills it:

- a linear weight stored as ``Q4_0`` / ``Q4_1`` / ``Q8_0``, ``Q5_0`` / ``Q5_1`` or the K-quants
  ``Q4_K`` / ``Q5_K`` / ``Q6_K`` (a ``Q4_K_M`` file's mix) becomes a
  :class:`~langchain_ascend.quant.linear.QuantizedLinear` over the file's own bytes, a view of
  the file's memory map (``quant.gguf_file``: nothing is copied, a page is read when first
  touched), so the products run on exactly what llama.cpp multiplies; a Llama q/k weight,
  whose rows are re-ordered (below), is the one copy;
- a linear weight in another block type (``Q2_K``, ``Q3_K``, ``IQ*``...) is de-quantized and
  re-quantized to the nearest supported format (:func:`target_format`), and logged;
- float linear weights (``F32``, ``F16``, ``BF16``) stay float unless ``quantization`` asks for
  ``"int8"`` (``q8_0``) or ``"int4"`` (``q4_1``);
- the token embedding, when quantized, becomes a
  :class:`~langchain_ascend.quant.embedding.QuantizedEmbedding` over the map (rows
  de-quantized on lookup: only the pages of the rows looked up are read); a tied LM head is a
  ``QuantizedLinear`` over the very same blocks;
- norms, biases and float tensors are de-quantized into the model dtype.

What llama.cpp's converter changed per family is ``langchain_ascend.families``' table: it
reorders the rows of Llama ``q_proj`` / ``k_proj`` for its rotary layout (per head, the pairs
``(x[2i], x[2i+1])`` instead of the halves); transformers' GGUF loader undoes it on the float
values, here the same row order is applied to the blocks (a row is its own blocks, so
reordering rows is exact): :func:`rotary_row_order`. Gemma's norm weights are stored plus one
(undone on the float values, as transformers does); a block embedding keeps the scale of a
scaled one (Gemma's ``sqrt(hidden)``: ``QuantizedEmbedding.replacing``). The model is
transformers' own class (or, for Llama, Qwen2 and Qwen3, the owned model's weight tree); the
CPU's owned models (``engine.cpu.models``) take its weights, and where none does, transformers'
forward runs over these quantized linears (``engine.cpu`` logs why).

``quantization="none"`` de-quantizes every tensor (the float model transformers would build).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from langchain_ascend import families
from langchain_ascend.errors import ModelSourceError
from langchain_ascend.quant import formats
from langchain_ascend.quant.gguf_config import load_gguf_config
from langchain_ascend.quant.gguf_file import (
    GGML_BF16,
    GGML_F16,
    GGML_F32,
    GGUFFile,
    GGUFFormatError,
    TensorInfo,
    block_geometry,
    release_pages,
)

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("gguf", "int8", "int4", "none")
"""``"gguf"``: run the file's blocks; ``"int8"`` / ``"int4"``: every linear (and a tied head)
in ``q8_0`` / ``q4_1``; ``"none"``: de-quantize everything."""
_FORMAT_OF_TYPE = {2: "q4_0", 3: "q4_1", 8: "q8_0", 6: "q5_0", 7: "q5_1", 12: "q4_k", 13: "q5_k",
                   14: "q6_k"}
_FLOAT_TYPES = frozenset({GGML_F32, GGML_F16, GGML_BF16})
_HIGH_PRECISION_BITS = 6.25
"""Block types the products do not run re-quantize to ``q8_0`` above this many bits per weight
(``Q8_K``), else to ``q4_1`` (``Q2_K``, ``Q3_K``, the ``IQ`` types)."""
SUPPORTED_ARCHITECTURES = families.GGUF_ARCHITECTURES
"""``general.architecture`` values this loader builds (``families.FAMILIES``). Others (MoE
experts, reshaped projections...) it refuses rather than build a wrong model
(``quantization=None`` de-quantizes them through transformers)."""


@dataclasses.dataclass
class GGUFLoadReport:
    """What :func:`load_gguf_model` did.

    Attributes:
        quantization: The mode it ran in.
        formats: Linear layers (LM head included) per weight format (``"q4_1"``,
            ``"float"``...).
        requantized: ``(tensor, file type, format)`` of each tensor re-quantized.
        weight_bytes: Bytes of every weight of the loaded model: the blocks (shared ones
            once) plus float parameters.
        quantized_bytes: The blocks' share of ``weight_bytes``.
        seconds: Wall time of the load.
    """

    quantization: str
    formats: Counter[str] = dataclasses.field(default_factory=Counter)
    requantized: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    weight_bytes: int = 0
    quantized_bytes: int = 0
    seconds: float = 0.0

    @property
    def weight_format(self) -> str:
        """The linear layers' formats, most common first: ``"q4_1+q8_0"``, ``"float"``."""
        return "+".join(fmt for fmt, _ in self.formats.most_common()) or "float"


def check_quantization(quantization: str) -> str:
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    return quantization


def target_format(ggml_type: int, quantization: str) -> str | None:
    """The block format a linear weight stored as ``ggml_type`` runs in, or None (float).

    Raises:
        ValueError: ``quantization`` is not one of :data:`QUANTIZATIONS`.
    """
    check_quantization(quantization)
    if quantization == "none":
        return None
    if quantization == "int8":
        return "q8_0"
    if quantization == "int4":
        return _FORMAT_OF_TYPE.get(ggml_type) if ggml_type in (2, 3) else "q4_1"
    if ggml_type in _FORMAT_OF_TYPE:
        return _FORMAT_OF_TYPE[ggml_type]
    if ggml_type in _FLOAT_TYPES:
        return None
    values, nbytes = block_geometry(ggml_type)
    return "q8_0" if 8 * nbytes / values > _HIGH_PRECISION_BITS else "q4_1"


def rotary_row_order(num_rows: int, num_heads: int) -> np.ndarray:
    """Row indices that turn llama.cpp's q/k row order back into transformers' (``hf =
    gguf[order]``): within each head of ``2 * half`` rows, llama.cpp stores row ``2 * i + j``
    where transformers has row ``j * half + i``."""
    half = num_rows // num_heads // 2
    return np.arange(num_rows).reshape(num_heads, half, 2).transpose(0, 2, 1).reshape(-1)


def _row_order(architecture: str, name: str, config: Any, rows: int) -> np.ndarray | None:
    family = families.by_architecture(architecture)
    if family is None or not family.rotary_rows_permuted:
        return None
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None)
    if heads is None or kv_heads is None:
        return None
    if ".attn_q." in name:
        return rotary_row_order(rows, heads)
    if ".attn_k." in name:
        return rotary_row_order(rows, kv_heads)
    return None


class _Filler:
    """Turns the file's tensors into the skeleton's weights (one load)."""

    def __init__(self, gguf: GGUFFile, config: Any, quantization: str, dtype: Any) -> None:
        self.gguf, self.config, self.quantization, self.dtype = gguf, config, quantization, dtype
        self.report = GGUFLoadReport(quantization=quantization)

    def float_tensor(self, info: TensorInfo) -> Any:
        """The tensor de-quantized, rows in transformers' order, in the model dtype."""
        import torch

        values = self.gguf.floats(info.name)  # (shape) float32
        order = _row_order(self.gguf.architecture, info.name, self.config, values.shape[0])
        if order is not None:
            values = values[order]
        offset = _norm_offset(self.gguf.architecture, info.name)
        if offset:
            values = values - np.float32(offset)  # Gemma: the file holds 1 + w
        return torch.from_numpy(np.ascontiguousarray(values)).to(self.dtype)

    def quantized(self, info: TensorInfo, fmt: str) -> Any:
        """The 2-D tensor as a ``QuantizedWeight`` in ``fmt``: the file's bytes when it is
        stored in ``fmt``, else re-quantized from its float values."""
        import torch

        rows, cols = info.shape
        order = _row_order(self.gguf.architecture, info.name, self.config, rows)
        if _FORMAT_OF_TYPE.get(info.ggml_type) == fmt:
            blocks = self.gguf.tensor(info.name)  # (N, row bytes), a view of the file's map
            if order is not None:  # rows re-ordered: a copy, and the file's pages given back
                # numpy's take moves whole rows (torch's index_select on uint8: ~6x slower)
                mapped, blocks = blocks, torch.from_numpy(np.take(blocks.numpy(), order, axis=0))
                release_pages(mapped)
            return formats.QuantizedWeight(fmt, rows, cols, blocks)
        weight = torch.from_numpy(np.ascontiguousarray(self.gguf.floats(info.name)))  # (N, K)
        if order is not None:
            weight = weight[torch.from_numpy(order)]
        if info.ggml_type not in _FLOAT_TYPES:
            self.report.requantized.append((info.name, info.type_name, fmt))
        return formats.quantize(weight, fmt)

    def fill(self, model: Any, names: dict[str, str]) -> None:
        """Give ``model`` (a skeleton) every tensor of the file it has a parameter for: block
        weights as quantized layers, the rest as float parameters."""
        import torch

        from langchain_ascend.quant.linear import replace_linears

        modules = dict(model.named_modules())
        embed_name = _name_of(modules, model.get_input_embeddings())
        head_name = _name_of(modules, model.get_output_embeddings())
        head_in_file = any(names.get(name) == f"{head_name}.weight" for name in self.gguf.tensors)
        tied = bool(getattr(self.config, "tie_word_embeddings", False)) and not head_in_file
        planned: dict[str, Any] = {}  # linear module name -> QuantizedWeight
        embed_qweight = None
        for gguf_name, info in self.gguf.tensors.items():
            hf_name = names.get(gguf_name)
            if hf_name is None:
                continue
            module_name, _, attr = hf_name.rpartition(".")
            module = modules.get(module_name)
            fmt = None
            if attr == "weight" and module_name == embed_name:
                keep_float = not tied and info.ggml_type in _FLOAT_TYPES
                fmt = None if keep_float else self.linear_format(info)
                if fmt is not None:
                    embed_qweight = self.quantized(info, fmt)
            elif attr == "weight" and isinstance(module, torch.nn.Linear):
                fmt = self.linear_format(info)
                if fmt is not None:
                    planned[module_name] = self.quantized(info, fmt)
            if fmt is None:
                _set_param(model, hf_name, self.float_tensor(info))
        if embed_qweight is not None:
            self._install_embedding(model, modules[embed_name], embed_name, embed_qweight)
            if tied and head_name:
                planned[head_name] = embed_qweight
        elif tied and isinstance(model.get_output_embeddings(), torch.nn.Linear):
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
        replace_linears(model, lambda name, _linear: planned.get(name))

    def _install_embedding(self, model: Any, embedding: Any, name: str, qweight: Any) -> None:
        from langchain_ascend.quant.embedding import QuantizedEmbedding

        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child,
                QuantizedEmbedding.replacing(embedding, qweight, dtype=self.dtype))

    def linear_format(self, info: TensorInfo) -> str | None:
        fmt = target_format(info.ggml_type, self.quantization)
        if fmt is not None and (len(info.shape) != 2 or info.shape[1] % 32):
            logger.info("%s: %s rows of %d values are not whole 32-value blocks; kept float",
                        self.gguf.path.name, info.name, info.shape[-1])
            return None
        return fmt


def _norm_offset(architecture: str, name: str) -> float:
    """What the file added to the tensor ``name``'s values (Gemma's norms: 1), else 0."""
    family = families.by_architecture(architecture)
    return family.norm_offset if family is not None and "norm.weight" in name else 0.0


def _name_of(modules: dict[str, Any], target: Any) -> str:
    """The qualified name of ``target`` among ``modules`` ("" when absent)."""
    return next((name for name, module in modules.items() if module is target), "")


def _skeleton(config: Any, dtype: Any) -> Any:
    """The model with every parameter on the meta device (buffers, e.g. the rotary
    frequencies, real), its weight initialisation skipped (every weight comes from the file;
    initialising meta tensors took ~0.15 s of a 1B load)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with init_empty_weights(include_buffers=False), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _name_map(model: Any, architecture: str, config: Any) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by the ``gguf`` package's table of
    llama.cpp's names (the table transformers' GGUF loader uses too)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        raise ModelSourceError(f"the installed gguf package does not know the architecture "
                               f"{architecture!r}")
    table = get_tensor_name_map(arch, int(config.num_hidden_layers))
    names: dict[str, str] = {}
    for hf_name in model.state_dict(keep_vars=True):
        base, dot, suffix = hf_name.rpartition(".")
        if suffix not in ("weight", "bias"):
            base, dot, suffix = hf_name, "", ""
        gguf_base = table.get_name(base)
        if gguf_base is not None:
            names.setdefault(f"{gguf_base}{dot}{suffix}", hf_name)
    return names


def _set_param(model: Any, name: str, tensor: Any) -> None:
    import torch

    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    if attr in owner._parameters:
        owner._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=False)
    else:
        owner._buffers[attr] = tensor


def load_gguf_model(path: str | os.PathLike[str], *, quantization: str = "gguf",
                    dtype: Any = None, config: Any = None, skeleton: Any = None,
                    ) -> tuple[Any, GGUFLoadReport]:
    """Build the causal LM in a GGUF file without de-quantizing its block weights.

    Args:
        path: The ``.gguf`` file.
        quantization: One of :data:`QUANTIZATIONS` (module docstring).
        dtype: The model dtype (float tensors, activations); default float32.
        config: The model's ``PretrainedConfig``; default read from the file
            (``quant.gguf_config.load_gguf_config``).
        skeleton: Builds the empty module tree to fill from ``config`` (default:
            transformers' model class, its weights on the meta device); the owned CPU model
            passes its own weight tree (``engine.cpu.models.llama_weights``), which needs no
            transformers modeling code.

    Returns:
        ``(model, report)``: the model in eval mode on the CPU, and a :class:`GGUFLoadReport`.

    Raises:
        ValueError: ``quantization`` is not one of :data:`QUANTIZATIONS`.
        ModelSourceError: The file is unreadable, of an architecture not in
            :data:`SUPPORTED_ARCHITECTURES`, or a model weight has no tensor in it.
    """
    import torch

    check_quantization(quantization)
    started = time.perf_counter()
    dtype = torch.float32 if dtype is None else dtype
    try:
        gguf = GGUFFile(path)
    except (GGUFFormatError, OSError) as error:
        raise ModelSourceError(f"cannot read the GGUF file {path}: {error}") from error
    if gguf.architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelSourceError(
            f"{path} holds a {gguf.architecture!r} model, whose GGUF blocks this package does "
            f"not run yet (it runs {', '.join(sorted(SUPPORTED_ARCHITECTURES))}); expected "
            "quantization=None, which de-quantizes it through transformers")
    config = load_gguf_config(gguf) if config is None else config
    model = _skeleton(config, dtype) if skeleton is None else skeleton(config)
    filler = _Filler(gguf, config, quantization, dtype)
    filler.fill(model, _name_map(model, gguf.architecture, config))
    _check_complete(model, gguf.path, config)
    report = filler.report
    del gguf, filler  # the map lives on while the model's views of it do
    _measure(model, report)
    report.seconds = time.perf_counter() - started
    for name, file_type, fmt in report.requantized:
        logger.info("%s: %s is %s, which has no native kernel: re-quantized to %s",
                    os.fspath(path), name, file_type, fmt)
    logger.info("loaded %s (%s) in %.2f s: linear layers %s, %.1f MB of weights",
                os.fspath(path), quantization, report.seconds, dict(report.formats),
                report.weight_bytes / 1e6)
    return model, report


def _check_complete(model: Any, path: Path, config: Any) -> None:
    """Raise when a parameter or buffer was left on the meta device (no tensor for it)."""
    missing = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()]
               if tensor.device.type == "meta"]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise ModelSourceError(f"{path} has no tensor for {shown}; expected every weight "
                               f"of its {config.model_type} architecture")


def _measure(model: Any, report: GGUFLoadReport) -> None:
    """Fill ``report``'s layer counts per format and its byte counts."""
    import torch

    from langchain_ascend.quant.linear import QuantizedLinear, quantized_weight_bytes

    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            report.formats[module.fmt] += 1
        elif isinstance(module, torch.nn.Linear):
            report.formats["float"] += 1
    report.quantized_bytes = quantized_weight_bytes(model)
    report.weight_bytes = report.quantized_bytes + sum(
        p.numel() * p.element_size() for p in model.parameters())
