"""What the model-source checks need of a GGUF file's header: :class:`GGUFInfo`, read by
the package's one GGUF reader (``quant.gguf_file.read_header``: metadata arrays skipped, not
decoded; every tensor checked to lie inside the file, which catches a truncated download).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langchain_ascend.errors import ModelSourceError
from langchain_ascend.quant.gguf_file import GGUFFormatError, GGUFHeader, read_header


@dataclasses.dataclass(frozen=True)
class GGUFInfo:
    """What :func:`inspect_gguf` read from a GGUF file's header (no tensor data is read).

    Attributes:
        path: The file.
        version: GGUF format version (2 or 3).
        architecture: ``general.architecture`` (``"llama"``, ``"qwen2"``...).
        name: ``general.name``, if present.
        num_tensors: Tensors in the file.
        num_elements: Weights in all tensors together (what float32 de-quantization stores,
            times 4 bytes).
        metadata_keys: Every metadata key, in file order.
        size: File size in bytes.
        values: The scalar and string metadata values by key (arrays are skipped, not read):
            ``"llama.context_length"``, ``"tokenizer.chat_template"``...
        header: The parsed header it was read from (the tensor table, the arrays' places).
    """

    path: Path
    version: int
    architecture: str
    name: str | None
    num_tensors: int
    num_elements: int
    metadata_keys: tuple[str, ...]
    size: int
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    header: GGUFHeader | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def has_tokenizer(self) -> bool:
        """Whether the file embeds a tokenizer vocabulary (transformers needs one)."""
        return "tokenizer.ggml.tokens" in self.metadata_keys

    @property
    def has_chat_template(self) -> bool:
        """Whether the file embeds a chat template (a chat model needs one)."""
        return "tokenizer.chat_template" in self.metadata_keys


def inspect_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a GGUF file's header: version, metadata keys, architecture, tensor table.

    Only the header is parsed, once per file version (``quant.gguf_file.read_header``); the
    same :class:`GGUFInfo` comes back for the same file.

    Raises:
        ModelSourceError: The file is missing, empty, not GGUF (bad magic), of an
            unsupported format version or byte order, truncated, or malformed.
    """
    file = Path(path)
    try:
        return _info(read_header(file))
    except GGUFFormatError as error:
        detail = str(error).removeprefix(f"{file}: ").removeprefix(f"{file} ")
        raise ModelSourceError(
            f"{file} is not a readable GGUF file: {detail}; expected a complete GGUF model "
            "file (a truncated download or another format?)") from None
    except OSError as error:
        raise ModelSourceError(f"cannot read GGUF file {file}: {error}") from error


@functools.lru_cache(maxsize=16)
def _info(header: GGUFHeader) -> GGUFInfo:
    """The info of a parsed header (the same object for the same header)."""
    architecture = header.metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise GGUFFormatError(f"{header.path}: it has no general.architecture metadata")
    name = header.metadata.get("general.name")
    values = {key: value for key, value in header.metadata.items()
              if key not in header.array_starts}
    info = GGUFInfo(path=header.path, version=header.version, architecture=architecture,
                    name=name if isinstance(name, str) else None,
                    num_tensors=len(header.tensors), num_elements=header.num_elements,
                    metadata_keys=tuple(header.metadata), size=header.size,
                    values=types.MappingProxyType(values), header=header)
    return info


def check_gguf_magic(file: Path) -> None:
    """A cheap first look (4 bytes) so a non-GGUF file is named as such early."""
    try:
        with open(file, "rb") as handle:
            magic = handle.read(4)
    except OSError as error:
        raise ModelSourceError(f"cannot read model file {file}: {error}") from error
    if magic != b"GGUF":
        raise ModelSourceError(
            f"{file} is not a GGUF file (it does not start with the GGUF magic bytes); "
            "expected a .gguf model file or an HF model folder")
