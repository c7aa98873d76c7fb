"""A GGUF model without a float copy: a cache folder with the config, tokenizer and generation
config, whose weights stay in the GGUF file (``quantization="gguf"``, ``"int8"``, ``"int4"``).

Layout (a folder's existence means "complete")::

    <cache>/gguf/<stem>-<sha256[:16]>-tf<transformers version>-v<CONVERTER_VERSION>-blocks<N>/
        config.json  generation_config.json  tokenizer.json  tokenizer_config.json ...
        source.json  ({"weights": "gguf", "gguf_file": <the file>, ...})

Writing it takes the config and the tokenizer, built from the file's metadata
(``gguf_tokenizer``: under a second of CPU for SmolLM2, once per file): no tensor is read.
The model runner sees ``source.json`` (:func:`gguf_weights_file`) and builds the model from the
GGUF file itself (``langchain_ascend.quant.gguf_model``). The folder is keyed by a hash of the
file's header (:func:`header_sha256`: the folder depends on nothing else, and hashing a 4 GB
file's tensors took seconds of a first load) and the transformers version, and written as the
de-quantized conversion is: into a temporary folder renamed into place under a lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from langchain_ascend.engine import hf_config
from langchain_ascend.engine.model_source.gguf_cache import cache_key, cached_sha256
from langchain_ascend.engine.model_source.gguf_header import GGUFInfo
from langchain_ascend.engine.model_source.gguf_tokenizer import gguf_tokenizer
from langchain_ascend.engine.model_source.support import (
    file_lock,
    make_shareable,
    package_version,
)
from langchain_ascend.errors import ModelSourceError
from langchain_ascend.quant.gguf_config import load_gguf_config
from langchain_ascend.quant.gguf_file import GGUFFile, GGUFFormatError
from langchain_ascend.quant.gguf_model import SUPPORTED_ARCHITECTURES

BLOCKS_VERSION = 2
"""Bump when the folder's content changes for the same file and library versions."""
SOURCE_FILE = "source.json"
WEIGHTS_IN_GGUF = "gguf"
"""``source.json``'s ``weights`` value of a folder whose weights are in the GGUF file."""


def runs_gguf_blocks(architecture: str) -> bool:
    """Whether the engine runs the blocks of a GGUF file of this ``general.architecture``."""
    return architecture in SUPPORTED_ARCHITECTURES


def gguf_weights_file(folder: str | os.PathLike[str]) -> Path | None:
    """The GGUF file holding ``folder``'s weights, or None for a folder with its own weights.

    Raises:
        ModelSourceError: ``source.json`` names a GGUF file that no longer exists.
    """
    try:
        source = json.loads((Path(folder) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(source, dict) or source.get("weights") != WEIGHTS_IN_GGUF:
        return None
    path = Path(str(source.get("gguf_file", "")))
    if not path.is_file():
        raise ModelSourceError(
            f"{folder} takes its weights from the GGUF file {path}, which no longer exists; "
            "expected the file it was made from (delete the folder to start over)")
    return path


def header_sha256(info: GGUFInfo) -> str:
    """The sha256 of what the folder is made from: the file's header (metadata and tensor
    table, ``info.header.data_start`` bytes), its size and where it is. Not the tensors: a
    first load of a 4 GB file would read all of it to hash it (seconds), and the folder holds
    nothing the tensors' bytes decide."""
    assert info.header is not None
    digest = hashlib.sha256(f"{info.path.resolve()}\0{info.size}\0".encode())
    with open(info.path, "rb") as handle:
        digest.update(handle.read(info.header.data_start))
    return digest.hexdigest()


def blocks_folder(info: GGUFInfo, *, cache_root: Path, progress: bool) -> Path:
    """The cached weightless folder of ``info.path`` (config, tokenizer, generation config),
    written once under a lock when missing; keyed by :func:`header_sha256`."""
    sha = header_sha256(info) if info.header is not None else cached_sha256(
        info.path, cache_root, progress=progress)
    final = cache_root / f"{cache_key(sha, info.path.name)}-blocks{BLOCKS_VERSION}"
    if _is_complete(final, info.path):
        return final
    cache_root.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_root / f".{final.name}.lock"):
        if _is_complete(final, info.path):
            return final
        if final.exists():  # leftovers, or made from a file that moved: start over
            shutil.rmtree(final, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache_root))
        try:
            write_blocks_folder(info.path, tmp)
            manifest = {"weights": WEIGHTS_IN_GGUF, "gguf_file": str(info.path.resolve()),
                        "header_sha256": sha, "size": info.size, "architecture": info.architecture,
                        "name": info.name, "transformers": package_version("transformers"),
                        "gguf": package_version("gguf"), "blocks_version": BLOCKS_VERSION}
            (tmp / SOURCE_FILE).write_text(json.dumps(manifest, indent=2) + "\n",
                                           encoding="utf-8")
            make_shareable(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not _is_complete(final, info.path):
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _is_complete(folder: Path, gguf_path: Path) -> bool:
    if not (folder / "config.json").is_file():
        return False
    try:
        return gguf_weights_file(folder) == gguf_path.resolve()
    except ModelSourceError:
        return False


def write_blocks_folder(gguf_path: Path, out_dir: Path) -> None:
    """Write ``gguf_path``'s config, tokenizer (with its chat template) and a generation config
    that stops at the tokenizer's EOS and the template's end-of-turn token into ``out_dir``.

    Raises:
        ModelSourceError: transformers could not build the tokenizer (the cause is chained).
    """
    try:
        gguf = GGUFFile(gguf_path)
        config = load_gguf_config(gguf)
    except (GGUFFormatError, OSError) as error:
        raise ModelSourceError(f"cannot read the GGUF file {gguf_path}: {error}") from error
    try:
        tokenizer = gguf_tokenizer(gguf_path, config.model_type, gguf)
    except Exception as error:  # noqa: BLE001 - never let a raw transformers error out
        raise ModelSourceError(
            f"transformers could not build the tokenizer of {gguf_path} "
            f"({type(error).__name__}: {error}); expected a GGUF model file with its "
            "vocabulary") from error
    generation = _generation_config(config, tokenizer)
    config.save_pretrained(out_dir)
    generation.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _generation_config(config: Any, tokenizer: Any) -> Any:
    from transformers import GenerationConfig

    generation = GenerationConfig.from_model_config(config)
    eos_ids = hf_config.stop_token_ids(generation, tokenizer)
    if eos_ids:
        generation.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
        if generation.pad_token_id is None:
            generation.pad_token_id = eos_ids[0]
    return generation
