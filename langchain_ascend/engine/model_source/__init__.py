"""Where a model's weights come from: a local HF folder, a GGUF file, or a hub id.

:func:`resolve_model_source` turns whatever the user named into the plain Hugging Face folder
the engine loads (kind ``"folder"``, ``"gguf"`` or ``"hub"``); a de-quantized GGUF is cached
under ``gguf/`` of the cache root keyed by the file's sha256 and the transformers version, so
a changed file or loader converts anew. :func:`check_model_source` runs the same checks
without converting or downloading: cheap enough for a constructor. Every failure is a
:class:`~langchain_ascend.errors.ModelSourceError` naming the path and what was expected.
Modules: ``locate`` (what was named), ``gguf_header`` (the header facts the checks need, read
by the package's one GGUF reader, ``quant.gguf_file``), ``gguf_convert`` (transformers' GGUF
conversion), ``gguf_cache`` (hashes, index, lock), ``gguf_blocks`` (the folder of a GGUF whose
blocks run as they are). User guide: README.md, "Models".
"""

from __future__ import annotations

import logging
import os

from langchain_ascend.cache_dir import CACHE_ENV_VAR
from langchain_ascend.engine.model_source.gguf_blocks import (
    blocks_folder,
    gguf_weights_file,
    runs_gguf_blocks,
)
from langchain_ascend.engine.model_source.gguf_cache import (
    CONVERTER_VERSION,
    GGUF_CACHE_SUBDIR,
    cache_key,
    converted_folder,
    file_sha256,
    gguf_cache_dir,
)
from langchain_ascend.engine.model_source.gguf_convert import (
    check_architecture,
    supported_gguf_architectures,
)
from langchain_ascend.engine.model_source.gguf_header import GGUFInfo, inspect_gguf
from langchain_ascend.engine.model_source.locate import (
    ResolvedModel,
    SourceKind,
    locate,
    source_string,
)

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_ENV_VAR",
    "CONVERTER_VERSION",
    "GGUF_CACHE_SUBDIR",
    "GGUFInfo",
    "ResolvedModel",
    "SourceKind",
    "cache_key",
    "check_model_source",
    "file_sha256",
    "gguf_cache_dir",
    "gguf_weights_file",
    "inspect_gguf",
    "resolve_model_source",
    "supported_gguf_architectures",
]


def resolve_model_source(
    model: str | os.PathLike[str],
    *,
    gguf_file: str | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    quantization: str | None = None,
) -> ResolvedModel:
    """Turn ``model`` into a local HF folder, de-quantizing a GGUF file once (then cached).

    Args:
        model: A local HF folder, a ``.gguf`` file, a folder holding GGUF files, or a hub id
            ``"org/name"`` that is not a local path.
        gguf_file: Which GGUF file of a folder (or hub snapshot) to use: a file name, or a
            path relative to the folder. Needed when the folder holds several; when given,
            the GGUF file is used even if the folder also has ``config.json``.
        progress: Show tqdm bars while hashing and converting (transformers' own bars too).
        cache_dir: Root of the conversion cache; default the package's cache root
            (``$LANGCHAIN_ASCEND_CACHE``, ``$XDG_CACHE_HOME/langchain_ascend``,
            ``~/.cache/langchain_ascend``). Conversions go to its ``gguf/`` folder.
        quantization: For a GGUF source: None or ``"none"`` de-quantizes it into float32
            safetensors (above); any other mode (``"auto"``, ``"gguf"``, ``"int8"``,
            ``"int4"``) gives a folder with the config, tokenizer and generation config only,
            whose weights the engine reads from the GGUF file itself (``gguf_blocks``: no
            conversion); ``"auto"`` falls back to None for an architecture whose blocks the
            engine does not run yet (``quant.gguf_model.SUPPORTED_ARCHITECTURES``). Ignored
            for an HF folder.

    Returns:
        The :class:`ResolvedModel`; for a GGUF source its ``path`` is the cached folder.

    Raises:
        ModelSourceError: The source is missing, is neither an HF folder nor GGUF, is a
            corrupt or truncated GGUF file, has an architecture transformers cannot load from
            GGUF, is a hub id absent from the local cache in offline mode, or its conversion
            failed. The message names the path and what was expected.
    """
    source = source_string(model)
    located = locate(source, gguf_file, download=True)
    if located.kind != "gguf":
        return ResolvedModel(path=located.target, kind=located.kind, source=source)
    info = inspect_gguf(located.target)
    check_architecture(info)
    if quantization == "auto" and not runs_gguf_blocks(info.architecture):
        logger.info("%s: the engine does not run %r GGUF blocks yet; de-quantizing it "
                    "(quantization='auto' -> None)", info.path, info.architecture)
        quantization = None
    if quantization not in (None, "none"):
        folder = blocks_folder(info, cache_root=gguf_cache_dir(cache_dir), progress=progress)
        return ResolvedModel(path=folder, kind="gguf", source=source, gguf_file=located.target)
    folder = converted_folder(info, cache_root=gguf_cache_dir(cache_dir),
                              progress=progress)
    return ResolvedModel(path=folder, kind="gguf", source=source, gguf_file=located.target)


def check_model_source(model: str | os.PathLike[str], *, gguf_file: str | None = None) -> str:
    """Validate ``model`` as :func:`resolve_model_source` would, without converting or
    downloading: the path exists, a folder has ``config.json`` and weights or GGUF files, a
    GGUF header is readable, complete and of an architecture transformers loads from GGUF.

    A hub id is checked against the local Hugging Face cache; when it is not there and the
    hub is reachable (no offline variable set) it passes: the download happens on resolve.

    Args:
        model: As for :func:`resolve_model_source`.
        gguf_file: As for :func:`resolve_model_source`.

    Returns:
        The kind the source resolves to: ``"folder"``, ``"gguf"`` or ``"hub"``.

    Raises:
        ModelSourceError: As for :func:`resolve_model_source` (conversion errors aside).
    """
    source = source_string(model)
    located = locate(source, gguf_file, download=False)
    if located.kind == "gguf":
        check_architecture(inspect_gguf(located.target))
    return located.kind
