"""A GGUF file's tensors, read where they lie: the metadata scalars and the tensor table, with
each tensor's bytes as a read-only view into one memory map of the file.

``gguf.GGUFReader`` decodes every metadata array into numpy views (seconds on a 49k-token
vocabulary); this reader decodes scalars, strings and numeric arrays, and records only the
length of string arrays (the vocabulary and merges, which the tokenizer reads on its own).
Nothing of a tensor is read until its bytes are used.

GGUF layout (little-endian): ``b"GGUF"``, version (u32, 2 or 3), tensor count (u64), key count
(u64), then the key/value pairs (key string, value type u32, value), then per tensor: name,
number of dims (u32), dims (u64 each, fastest-moving first), ggml type (u32), offset (u64,
from the data section's start); the data section starts at the next multiple of
``general.alignment`` (32 by default).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
"""ggml type ids of the value types and of the block formats the package runs as they are."""
FLOAT_TYPES = {GGML_F32: np.float32, GGML_F16: np.float16}
"""ggml value types numpy reads directly (bf16 is read as uint16 and widened)."""
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32
_MAX_ARRAY = 4096  # longer numeric arrays are recorded as their length


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader can read (bad magic, version, truncated...)."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file.

    Attributes:
        name: The GGUF tensor name (``blk.0.attn_q.weight``).
        shape: In torch order (``(out_features, in_features)`` for a linear weight).
        ggml_type: The ggml type id (``GGML_Q4_1``...).
        start: Byte offset of its data from the start of the file.
        nbytes: Bytes of its data.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    start: int
    nbytes: int

    @property
    def type_name(self) -> str:
        """``"Q4_1"``, ``"F32"``... (the ``gguf`` package's name of the type)."""
        return ggml_type_name(self.ggml_type)


def ggml_type_name(ggml_type: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def block_geometry(ggml_type: int) -> tuple[int, int]:
    """``(values per block, bytes per block)`` of a ggml type (``(1, 4)`` for F32).

    Raises:
        GGUFFormatError: The type is unknown to the installed ``gguf`` package.
    """
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"unknown ggml type {ggml_type}") from None


class GGUFFile:
    """A GGUF file, memory-mapped: scalar metadata, the tensor table, and tensor bytes.

    Args:
        path: The ``.gguf`` file.

    Attributes:
        path: The file.
        version: GGUF format version.
        metadata: Every key; scalars and strings as values, numeric arrays of up to 4096
            values as lists, string arrays and longer numeric arrays as their length (an
            ``int``).
        tensors: Tensor name -> :class:`TensorInfo`, in file order.

    Raises:
        GGUFFormatError: Not GGUF, an unsupported version, or a table that runs past the end
            of the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._blob = np.memmap(self.path, mode="r", dtype=np.uint8)  # (file bytes,)
        self._bytes = memoryview(self._blob)  # type: ignore[arg-type]  # struct reads this
        self._pos = 0
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._value_starts: dict[str, int] = {}  # key -> byte offset of its value's type
        self._parse()

    # ------------------------------------------------------------------ parsing

    def _take(self, fmt: str) -> Any:
        width = struct.calcsize(fmt)
        if self._pos + width > self._blob.size:
            raise GGUFFormatError(f"{self.path}: the header ends early at byte {self._pos} "
                                  "(truncated file?)")
        (value,) = struct.unpack_from(fmt, self._bytes, self._pos)
        self._pos += width
        return value

    def _string(self) -> str:
        length = self._take("<Q")
        start, self._pos = self._pos, self._pos + length
        if self._pos > self._blob.size:
            raise GGUFFormatError(f"{self.path}: a string at byte {start} runs past the end")
        return str(self._bytes[start:self._pos], "utf-8", errors="replace")  # no memmap slice

    def _value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self._take(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise GGUFFormatError(f"{self.path}: unknown metadata value type {kind}")
        item, count = self._take("<I"), self._take("<Q")
        if item in _SCALARS:
            width = struct.calcsize(_SCALARS[item])
            if self._pos + count * width > self._blob.size:
                raise GGUFFormatError(f"{self.path}: an array runs past the end of the file")
            if count > _MAX_ARRAY:  # token types, scores: the tokenizer reads them itself
                self._pos += count * width
                return count
            values = list(struct.unpack_from(f"<{count}{_SCALARS[item][1]}", self._bytes,
                                             self._pos))
            self._pos += count * width
            return values
        if item == _STRING:  # the vocabulary, merges...: only walked over
            for _ in range(count):
                length = self._take("<Q")
                self._pos += length
            if self._pos > self._blob.size:
                raise GGUFFormatError(f"{self.path}: an array runs past the end of the file")
            return count
        return [self._value(item) for _ in range(count)]

    def _parse(self) -> None:
        if self._blob.size < 24 or bytes(self._blob[:4]) != b"GGUF":
            raise GGUFFormatError(f"{self.path} does not start with the GGUF magic bytes")
        self._pos = 4
        self.version = self._take("<I")
        if self.version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: GGUF version {self.version} (expected 2 or 3)")
        num_tensors, num_keys = self._take("<Q"), self._take("<Q")
        for _ in range(num_keys):
            key = self._string()
            self._value_starts[key] = self._pos
            self.metadata[key] = self._value(self._take("<I"))
        table = []
        for _ in range(num_tensors):
            name = self._string()
            dims = [self._take("<Q") for _ in range(self._take("<I"))]
            ggml_type, offset = self._take("<I"), self._take("<Q")
            table.append((name, tuple(reversed(dims)), ggml_type, offset))
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-self._pos // alignment) * alignment
        for name, shape, ggml_type, offset in table:
            values, nbytes = block_geometry(ggml_type)
            count = int(np.prod(shape)) if shape else 1
            if shape and shape[-1] % values:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} has rows of {shape[-1]} "
                                      f"values, not a multiple of its {values}-value blocks")
            info = TensorInfo(name, shape, ggml_type, data_start + offset,
                              count // values * nbytes)
            if info.start + info.nbytes > self._blob.size:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} runs past the end of the "
                                      "file (truncated download?)")
            self.tensors[name] = info

    # ------------------------------------------------------------------ access

    def array(self, key: str) -> list[Any]:
        """Every element of the metadata array ``key``, decoded (``metadata`` holds only the
        length of a string array or of a long numeric one): the vocabulary
        (``tokenizer.ggml.tokens``), the merges, the token types...

        Raises:
            KeyError: The file has no such key.
            GGUFFormatError: ``key`` is not an array.
        """
        self._pos = self._value_starts[key]
        if self._take("<I") != _ARRAY:
            raise GGUFFormatError(f"{self.path}: metadata {key!r} is not an array")
        item, count = self._take("<I"), self._take("<Q")
        if item in _SCALARS:
            values = struct.unpack_from(f"<{count}{_SCALARS[item][1]}", self._bytes, self._pos)
            return list(values)
        return [self._value(item) for _ in range(count)]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def raw(self, name: str) -> np.ndarray:
        """``(rows, row_bytes)`` uint8 read-only view of a tensor's bytes (``rows`` = the product
        of every dimension but the last; one row of a linear weight is one output feature)."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        view = self._blob[info.start:info.start + info.nbytes]  # (nbytes,)
        return view.reshape(rows, info.nbytes // rows)

    def read(self, name: str) -> np.ndarray:
        """A fresh ``(rows, row_bytes)`` uint8 copy of a tensor's bytes, read from the file
        (not through the memory map: the copy is all this process holds of it, the page cache
        is not counted in its memory)."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        data = np.fromfile(self.path, dtype=np.uint8, count=info.nbytes, offset=info.start)
        if data.size != info.nbytes:
            raise GGUFFormatError(f"{self.path}: tensor {name!r} ends early (truncated file?)")
        return data.reshape(rows, info.nbytes // rows)

    def floats(self, name: str) -> np.ndarray:
        """A tensor de-quantized to float32, in its torch shape (a fresh array)."""
        info = self.tensors[name]
        data = self.read(name)
        if info.ggml_type in FLOAT_TYPES:
            values = data.view(FLOAT_TYPES[info.ggml_type]).astype(np.float32)
        elif info.ggml_type == GGML_BF16:
            values = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import dequantize

            values = dequantize(np.asarray(data), GGMLQuantizationType(info.ggml_type)).astype(
                np.float32, copy=False)
        return values.reshape(info.shape)
