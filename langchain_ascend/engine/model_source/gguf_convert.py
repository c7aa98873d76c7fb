"""GGUF to an HF folder: which architectures transformers loads from GGUF, and the conversion
itself (transformers' GGUF loader, de-quantized to float32, saved as safetensors with the
tokenizer, chat template and a generation config that stops at the end-of-turn token)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from langchain_ascend.engine.hf_config import stop_token_ids
from langchain_ascend.engine.model_source.gguf_header import GGUFInfo
from langchain_ascend.engine.model_source.support import package_version, progress_bar
from langchain_ascend.errors import ModelSourceError

# transformers' GGUF table also lists encoder-decoder models; AutoModelForCausalLM loads none.
_NOT_CAUSAL_LM = frozenset({"t5", "t5encoder", "umt5"})


def supported_gguf_architectures() -> frozenset[str]:
    """The ``general.architecture`` values transformers loads from GGUF as causal LMs.

    Read from transformers itself: the legacy loader's config table
    (``transformers.integrations.ggml.GGUF_CONFIG_MAPPING``) plus, where present, the newer
    loader's ``transformers.integrations.gguf.GGUF_ARCHS`` (that one imports torch).
    Encoder-decoder entries (t5, umt5) are left out.
    """
    names = set(_legacy_gguf_architectures())
    with contextlib.suppress(ImportError):
        from transformers.integrations.gguf import GGUF_ARCHS

        names |= set(GGUF_ARCHS)
    return frozenset(names - _NOT_CAUSAL_LM)


def _legacy_gguf_architectures() -> frozenset[str]:
    """The legacy loader's table alone: it needs no torch import, so checks stay cheap."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return frozenset(set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"} - _NOT_CAUSAL_LM)


def _architecture_candidates(architecture: str) -> set[str]:
    """The names transformers' loader may map a llama.cpp architecture to (``qwen2moe`` ->
    ``qwen2_moe``, ``gpt-oss`` -> ``gpt_oss``...)."""
    underscored = architecture.replace("-", "_")
    return {architecture, underscored, re.sub(r"moe$", "_moe", underscored)}


def check_architecture(info: GGUFInfo) -> None:
    candidates = _architecture_candidates(info.architecture)
    if candidates & _legacy_gguf_architectures():
        supported: frozenset[str] = frozenset()
    else:  # the newer loader's table imports torch: consulted only when needed
        supported = supported_gguf_architectures()
    if supported and not candidates & supported:
        raise ModelSourceError(
            f"{info.path} holds a {info.architecture!r} model (general.architecture), which "
            f"transformers {package_version('transformers')} cannot load from GGUF as a causal LM; "
            f"expected one of: {', '.join(sorted(supported))}")
    if not info.has_tokenizer:
        raise ModelSourceError(
            f"{info.path} embeds no tokenizer (no tokenizer.ggml.tokens metadata); expected a "
            "GGUF model file with its vocabulary, as llama.cpp's converter writes")


def convert_gguf(gguf_path: Path, out_dir: Path, *, progress: bool) -> None:
    """De-quantize ``gguf_path`` into ``out_dir`` (empty, existing) as a float32 HF folder.

    Loads through transformers (``from_pretrained(folder, gguf_file=name)``), strips the GGUF
    quantizer marks so ``save_pretrained`` writes plain safetensors, makes sure the generation
    config stops at the tokenizer's EOS and at the chat template's end-of-turn token, saves
    model, generation config and tokenizer (with its chat template), then reloads the
    tokenizer and generation config from ``out_dir`` to check they survived.

    Raises:
        ModelSourceError: transformers failed to load or save it (the cause is chained).
    """
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    bar = progress_bar(progress, total=4, desc=f"De-quantizing {gguf_path.name}", unit="step")
    try:
        _convert_steps(gguf_path, out_dir, bar)
    except ModelSourceError:
        raise
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - never let a raw transformers error out
        raise ModelSourceError(
            f"transformers could not convert the GGUF file {gguf_path} "
            f"({type(error).__name__}: {error}); expected a GGUF causal LM transformers "
            f"{package_version('transformers')} supports") from error
    finally:
        if bar is not None:
            bar.close()
        if bars_were_on and not progress:
            hf_logging.enable_progress_bar()


def _convert_steps(gguf_path: Path, out_dir: Path, bar: Any) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    def step(label: str) -> None:
        if bar is not None:
            bar.set_postfix_str(label)
            bar.update(1)

    folder, name = str(gguf_path.parent), gguf_path.name
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, output_loading_info=True,
        **_dequantize_kwargs())
    model, loading = loaded  # (model, {"missing_keys": ..., "mismatched_keys": ...})
    step("model loaded")
    for what in ("missing_keys", "mismatched_keys"):  # transformers fills them with noise
        keys = sorted(str(key) for key in (loading.get(what) or ()))
        if keys:
            shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
            raise ModelSourceError(
                f"{gguf_path}: transformers found no usable weights for {shown} "
                f"({what.replace('_', ' ')}); expected a GGUF file with every tensor of its "
                f"{model.config.model_type} architecture")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    step("tokenizer loaded")
    packed = sorted({type(m).__name__ for m in model.modules()
                     if type(m).__name__.startswith("Gguf")})
    if packed:
        raise ModelSourceError(
            f"transformers kept {gguf_path}'s weights packed ({', '.join(packed)}); expected "
            "plain de-quantized float32 layers")
    _drop_quantizer(model)
    eos_ids = stop_token_ids(model.generation_config, tokenizer)
    if eos_ids:
        model.generation_config.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
        if model.generation_config.pad_token_id is None:
            model.generation_config.pad_token_id = eos_ids[0]
    model.save_pretrained(out_dir)
    if not (out_dir / "generation_config.json").is_file():
        model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    step("saved")

    saved_tokenizer = AutoTokenizer.from_pretrained(out_dir)
    saved_generation = GenerationConfig.from_pretrained(out_dir)
    saved_config = AutoConfig.from_pretrained(out_dir)
    problems = []
    if tokenizer.chat_template and saved_tokenizer.chat_template != tokenizer.chat_template:
        problems.append("the chat template changed")
    if saved_tokenizer.eos_token_id != tokenizer.eos_token_id:
        problems.append(f"the tokenizer EOS became {saved_tokenizer.eos_token_id} "
                        f"(was {tokenizer.eos_token_id})")
    saved_eos = saved_generation.eos_token_id
    saved_eos = saved_eos if isinstance(saved_eos, list) else [saved_eos]
    if eos_ids and saved_eos != eos_ids:
        problems.append(f"generation_config eos_token_id is {saved_eos}, expected {eos_ids}")
    if getattr(saved_config, "quantization_config", None) is not None:
        problems.append("config.json still names a quantization_config")
    if problems:
        raise ModelSourceError(
            f"the de-quantized copy of {gguf_path} in {out_dir} did not round-trip: "
            f"{'; '.join(problems)}")
    step("verified")


def _dequantize_kwargs() -> dict[str, Any]:
    """``quantization_config=GgufConfig(dequantize=True)`` where transformers has that option
    (its newer GGUF path otherwise keeps weights packed when the ``kernels`` package is
    installed); nothing on versions without it, which always de-quantize."""
    import inspect

    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    if "dequantize" not in inspect.signature(GgufConfig.__init__).parameters:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_quantizer(model: Any) -> None:
    """Forget the GGUF quantizer: the weights are plain float32 now, and ``save_pretrained``
    refuses models that still carry a non-serializable quantizer."""
    for attribute, value in (("hf_quantizer", None), ("is_quantized", False),
                             ("quantization_method", None)):
        if hasattr(model, attribute):
            setattr(model, attribute, value)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
