"""The transformers config of a GGUF model, from the file's metadata, in milliseconds.

transformers rebuilds it through ``gguf.GGUFReader``, which decodes the whole vocabulary first
(5-11 s for SmolLM2's 49k tokens on 2 busy cores). For the architectures whose config is a plain
renaming of metadata keys (:data:`PLAIN_ARCHITECTURES`: every family of
``langchain_ascend.families``) this module applies transformers' own renaming table
(``transformers.integrations.ggml.GGUF_CONFIG_MAPPING``) to the scalars
:class:`~langchain_ascend.quant.gguf_file.GGUFFile` reads, with the same rules as transformers'
loader (an architecture value renamed -- ``gemma3`` is the text model's ``gemma3_text`` --,
``tie_word_embeddings`` when the file has no ``output.weight``, ``vocab_size`` from the
vocabulary when absent) plus one fix:
``attention.key_length`` is the head size where the table has none (transformers leaves Qwen3's
at its default of 128, wrong for a model with other heads); every other architecture goes
through transformers itself. A test checks both routes give the same config.

What transformers' loader drops it drops here too, so the model is the one transformers builds
from the file; where llama.cpp would run something else (Phi-3's partial rotary, its longrope
factor tensors) :func:`load_gguf_config` logs a warning naming it (:func:`dropped_by_transformers`).
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend import families
from langchain_ascend.quant.gguf_file import GGUFFile

PLAIN_ARCHITECTURES = families.GGUF_ARCHITECTURES
"""``general.architecture`` values whose config is the renamed metadata and nothing else."""
_IGNORED = {"GGUF", "general.file_type", "general.quantization_version"}
_ROPE_FACTOR_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")

logger = logging.getLogger(__name__)


def dropped_by_transformers(gguf: GGUFFile) -> list[str]:
    """What of ``gguf`` transformers' GGUF loader (and so this package) leaves out though
    llama.cpp uses it: a rotary width below the head size (Phi-4-mini's partial rotary), rope
    factor tensors (Phi-3's longrope). Empty for the usual file."""
    metadata = gguf.metadata
    architecture = gguf.architecture
    dropped = [name for name in _ROPE_FACTOR_TENSORS if name in gguf.tensors]
    rotary = metadata.get(f"{architecture}.rope.dimension_count")
    hidden = metadata.get(f"{architecture}.embedding_length")
    heads = metadata.get(f"{architecture}.attention.head_count")
    head_size = metadata.get(f"{architecture}.attention.key_length")
    if head_size is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head_size = hidden // heads
    if isinstance(rotary, int) and isinstance(head_size, int) and rotary < head_size:
        dropped.append(f"rope.dimension_count {rotary} < head size {head_size}")
    return dropped


def gguf_config_dict(gguf: GGUFFile) -> dict[str, Any] | None:
    """The config dict transformers' GGUF loader would build, or None where the architecture
    is not one of :data:`PLAIN_ARCHITECTURES` (or the name says Mistral, which transformers
    renames): use :func:`load_gguf_config` for those."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    tables: dict[str, dict[str, Any]] = dict(GGUF_CONFIG_MAPPING)  # type: ignore[arg-type]
    metadata = gguf.metadata
    architecture = gguf.architecture
    name = metadata.get("general.name")
    if architecture not in PLAIN_ARCHITECTURES or (
            isinstance(name, str) and "mistral" in name.lower()):
        return None
    config: dict[str, Any] = {
        "tie_word_embeddings": "output.weight" not in gguf.tensors}
    for key, value in metadata.items():
        prefix, _, rest = key.partition(".")
        table = tables.get(prefix)
        if table is None or rest not in table or table[rest] is None or key in _IGNORED:
            continue
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        config[table[rest]] = value
    family = families.by_architecture(architecture)
    if family is not None and config.get("model_type") == architecture:
        config["model_type"] = family.model_type  # gemma3 -> gemma3_text, as transformers does
    key_length = metadata.get(f"{architecture}.attention.key_length")
    if "head_dim" not in config and isinstance(key_length, int):
        config["head_dim"] = key_length  # transformers' table leaves it out (Qwen3: default 128)
    if "vocab_size" not in config and isinstance(metadata.get("tokenizer.ggml.tokens"), int):
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]
    return config


def load_gguf_config(gguf: GGUFFile) -> Any:
    """The ``PretrainedConfig`` of the model in ``gguf``: from :func:`gguf_config_dict` where it
    applies, else through transformers (``AutoConfig.from_pretrained(folder, gguf_file=...)``,
    which reads the whole metadata: seconds)."""
    from transformers import AutoConfig

    dropped = dropped_by_transformers(gguf)
    if dropped:
        logger.warning("%s: transformers' GGUF loader leaves out %s, which llama.cpp uses; the "
                       "model runs as transformers builds it (full rotary, no rope factors)",
                       gguf.path.name, ", ".join(dropped))
    config_dict = gguf_config_dict(gguf)
    if config_dict is None:
        return AutoConfig.from_pretrained(str(gguf.path.parent), gguf_file=gguf.path.name)
    return AutoConfig.for_model(**config_dict)
