"""The package's one GGUF reader: the header (metadata and tensor table) parsed once per file
version, and the tensors' bytes used in place from one memory map of the file.

``gguf.GGUFReader`` decodes every metadata array into numpy views (15-36 s of CPU on a
49k-token vocabulary, issue 28); :func:`read_header` decodes scalars, strings and short
numeric arrays, records only where string arrays and long numeric arrays lie (the vocabulary
and merges: :meth:`GGUFFile.array` decodes one when asked), and checks that every tensor lies
inside the file (a truncated download). The ``gguf`` package supplies the type tables and
the de-quantization of other block types.

:class:`GGUFFile` maps the file once (copy-on-write: a write into a view changes this process's
page, never the file) and hands out tensors as views of the map (:meth:`GGUFFile.tensor`): a
block weight the products read in the file's layout is never copied, and a page of it is read
from the disk when first touched. Pages of a tensor that was copied into another layout are
given back with :func:`release_pages` (``madvise(MADV_DONTNEED)``: the page cache keeps them,
this process stops holding them), so the copy and the file's pages are not both resident.

GGUF layout (little-endian): ``b"GGUF"``, version (u32, 2 or 3), tensor count (u64), key count
(u64), then the key/value pairs (key string, value type u32, value), then per tensor: name,
number of dims (u32), dims (u64 each, fastest-moving first), ggml type (u32), offset (u64,
from the data section's start); the data section starts at the next multiple of
``general.alignment`` (32 by default), and every tensor's offset is a multiple of it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import mmap
import os
import struct
import threading
import types
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from langchain_ascend.errors import ModelSourceError

if TYPE_CHECKING:
    import torch

GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
"""ggml type ids of the value types and of the block formats the package runs as they are."""
FLOAT_TYPES = {GGML_F32: np.float32, GGML_F16: np.float16}
"""ggml value types numpy reads directly (bf16 is read as uint16 and widened)."""
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32
_MAX_ARRAY = 4096  # longer numeric arrays are recorded as their length
_U64 = struct.Struct("<Q")


class GGUFFormatError(ModelSourceError):
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

    @property
    def rows(self) -> int:
        """The product of every dimension but the last (1 for a vector)."""
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1


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


@dataclasses.dataclass(frozen=True, eq=False)
class GGUFHeader:
    """A GGUF file's header, as :func:`read_header` parsed it (no tensor data is read).

    Attributes:
        path: The file.
        size: File size in bytes.
        version: GGUF format version (2 or 3).
        metadata: Every key, in file order (read-only): scalars and strings as values,
            numeric arrays of up to 4096 values as lists, string arrays and longer numeric
            arrays as their length (an ``int``; :meth:`GGUFFile.array` decodes them).
        tensors: Tensor name -> :class:`TensorInfo`, in file order (read-only).
        data_start: Byte offset of the data section (the header's length, aligned).
        array_starts: Array key -> byte offset of its value (element type, count, elements).
    """

    path: Path
    size: int
    version: int
    metadata: Mapping[str, Any]
    tensors: Mapping[str, TensorInfo]
    data_start: int
    array_starts: Mapping[str, int]

    @property
    def architecture(self) -> str:
        """``general.architecture`` (``""`` when absent)."""
        return str(self.metadata.get("general.architecture", ""))

    @property
    def num_elements(self) -> int:
        """Weights in all tensors together."""
        return sum(int(np.prod(info.shape)) if info.shape else 1
                   for info in self.tensors.values())


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """``path``'s header, parsed once per file version (size, modification time and inode are
    the cache key: a rewritten file is parsed again).

    Raises:
        GGUFFormatError: Empty, not GGUF (bad magic), big-endian, an unsupported version, a
            value that cannot occur in a valid file, or a header or tensor that runs past the
            end of the file (truncated).
        OSError: The file cannot be opened.
    """
    file = Path(path)
    stat = file.stat()
    return _cached_header(file, stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=16)
def _cached_header(file: Path, size: int, mtime_ns: int, inode: int) -> GGUFHeader:
    del mtime_ns, inode  # only part of the cache key
    if size == 0:
        raise GGUFFormatError(f"{file}: the file is empty")
    with open(file, "rb") as handle, mmap.mmap(handle.fileno(), 0,
                                               access=mmap.ACCESS_READ) as blob:
        return _Parser(file, blob, size).header()


class _Parser:
    """Little-endian reads of a header from a buffer, every read bounds-checked."""

    def __init__(self, path: Path, blob: Any, size: int) -> None:
        self.path, self.blob, self.size, self.pos = path, blob, size, 0

    def fail(self, detail: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: {detail}")

    def truncated(self, what: str) -> GGUFFormatError:
        return self.fail(f"{what} runs past the end of the file (byte {self.pos} of "
                         f"{self.size}): the file is truncated")

    def take(self, fmt: str) -> Any:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise self.truncated("the header")
        (value,) = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += width
        return value

    def skip(self, num_bytes: int) -> None:
        if num_bytes < 0 or self.pos + num_bytes > self.size:
            raise self.truncated("a header field")
        self.pos += num_bytes

    def string(self) -> str:
        length = self.take("<Q")
        start = self.pos
        self.skip(length)
        try:
            return bytes(self.blob[start:self.pos]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"a header string at byte {start} is not UTF-8") from None

    def strings(self, count: int, keep: bool) -> list[str] | None:
        """``count`` length-prefixed strings, decoded (``keep``) or only walked over."""
        blob, size, pos = self.blob, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[str] | None = [] if keep else None
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                raise self.truncated("a header string")
            length = unpack(blob, pos)[0]
            if pos + 8 + length > size:
                self.pos = pos
                raise self.truncated("a header string")
            if out is not None:
                out.append(str(blob[pos + 8:pos + 8 + length], "utf-8", errors="replace"))
            pos += 8 + length
        self.pos = pos
        return out

    def array(self, decode: bool) -> Any:
        """An array value (after its type): a list, or its length where not ``decode``d and
        it holds strings or more than :data:`_MAX_ARRAY` numbers."""
        item, count = self.take("<I"), self.take("<Q")
        if item in _SCALARS:
            width = struct.calcsize(_SCALARS[item])
            if self.pos + count * width > self.size:
                raise self.truncated("an array")
            if not decode and count > _MAX_ARRAY:
                self.pos += count * width
                return count
            values = list(struct.unpack_from(f"<{count}{_SCALARS[item][1]}", self.blob,
                                             self.pos))
            self.pos += count * width
            return values
        if item == _STRING:
            strings = self.strings(count, keep=decode)
            return strings if decode else count
        if item == _ARRAY:
            return [self.array(decode) for _ in range(count)]
        raise self.fail(f"unknown metadata array element type {item} at byte {self.pos}")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array(decode=False)
        raise self.fail(f"unknown metadata value type {kind} at byte {self.pos - 4}")

    def version(self) -> int:
        if self.size < 4 or bytes(self.blob[:4]) != b"GGUF":
            raise self.fail("it does not start with the GGUF magic bytes")
        self.pos = 4
        version = self.take("<I")
        if version not in (2, 3):
            swapped = struct.unpack(">I", struct.pack("<I", version))[0]
            raise self.fail("it is big-endian" if swapped in (2, 3)
                            else f"format version {version} is not 2 or 3")
        return version

    def header(self) -> GGUFHeader:
        version = self.version()
        num_tensors, num_keys = self.take("<Q"), self.take("<Q")
        metadata: dict[str, Any] = {}
        array_starts: dict[str, int] = {}
        for _ in range(num_keys):
            key = self.string()
            kind = self.take("<I")
            if kind == _ARRAY:
                array_starts[key] = self.pos
            metadata[key] = self.value(kind)
        table = []
        for _ in range(num_tensors):
            name = self.string()
            num_dims = self.take("<I")
            dims = [self.take("<Q") for _ in range(num_dims)]
            table.append((name, tuple(reversed(dims)), self.take("<I"), self.take("<Q")))
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0:
            raise self.fail(f"general.alignment={alignment!r} is not a positive integer")
        data_start = -(-self.pos // alignment) * alignment
        tensors = {}
        for name, shape, ggml_type, offset in table:
            tensors[name] = self.tensor(name, shape, ggml_type, data_start + offset)
        return GGUFHeader(self.path, self.size, version, types.MappingProxyType(metadata),
                          types.MappingProxyType(tensors), data_start,
                          types.MappingProxyType(array_starts))

    def tensor(self, name: str, shape: tuple[int, ...], ggml_type: int,
               start: int) -> TensorInfo:
        try:
            values, nbytes = block_geometry(ggml_type)
        except GGUFFormatError:
            raise self.fail(f"tensor {name!r} has unknown ggml type {ggml_type}") from None
        count = int(np.prod(shape)) if shape else 1
        if shape and shape[-1] % values:
            raise self.fail(f"tensor {name!r} has rows of {shape[-1]} values, not a multiple "
                            f"of its {values}-value blocks")
        info = TensorInfo(name, shape, ggml_type, start, count // values * nbytes)
        if info.start + info.nbytes > self.size:
            raise self.fail(f"tensor {name!r} needs bytes {info.start}..{info.start + info.nbytes}"
                            f" and the file has {self.size}: the file is truncated")
        return info


class _Mappings:
    """The address ranges of the live maps of GGUF files (weakly held), so that pages under a
    tensor can be given back without knowing which file it came from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: list[tuple[int, int, weakref.ref[mmap.mmap]]] = []

    def add(self, base: int, size: int, blob: mmap.mmap) -> None:
        with self._lock:
            self._ranges = [r for r in self._ranges if r[2]() is not None]
            self._ranges.append((base, size, weakref.ref(blob)))

    def find(self, address: int, nbytes: int) -> tuple[int, mmap.mmap] | None:
        """``(base, map)`` of the live map holding ``address .. address + nbytes``."""
        with self._lock:
            for base, size, ref in self._ranges:
                blob = ref()
                if blob is not None and base <= address and address + nbytes <= base + size:
                    return base, blob
        return None


_MAPPINGS = _Mappings()


def release_pages(tensor: torch.Tensor) -> int:
    """Give back this process's pages of a GGUF file under ``tensor`` (a view from
    :meth:`GGUFFile.tensor` that was copied into another layout): the pages lying wholly
    inside its bytes (``madvise(MADV_DONTNEED)``; the file stays in the page cache, a later
    read of the view faults them in again). Any other tensor is left alone.

    Returns:
        Bytes given back (0 for a tensor not in a GGUF file's map).
    """
    nbytes = tensor.numel() * tensor.element_size()
    found = _MAPPINGS.find(tensor.data_ptr(), nbytes) if nbytes else None
    if found is None or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    base, blob = found
    page = mmap.PAGESIZE
    start = -(-(tensor.data_ptr() - base) // page) * page
    stop = (tensor.data_ptr() - base + nbytes) // page * page
    if stop <= start:
        return 0
    blob.madvise(mmap.MADV_DONTNEED, start, stop - start)
    return stop - start


def in_mapped_file(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s bytes lie in the live map of a GGUF file (used in place)."""
    nbytes = max(1, tensor.numel() * tensor.element_size())
    return _MAPPINGS.find(tensor.data_ptr(), nbytes) is not None


class GGUFFile:
    """A GGUF file: its header (:func:`read_header`, shared) and one memory map of its bytes.

    Args:
        path: The ``.gguf`` file.

    Attributes:
        path: The file.
        version: GGUF format version.
        header: The parsed :class:`GGUFHeader`.
        metadata: This object's copy of ``header.metadata`` (a plain dict).
        tensors: Tensor name -> :class:`TensorInfo`, in file order.

    Raises:
        GGUFFormatError: As :func:`read_header`.
        OSError: The file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.header = read_header(path)
        self.path = self.header.path
        self.version = self.header.version
        self.metadata: dict[str, Any] = dict(self.header.metadata)
        self.tensors: Mapping[str, TensorInfo] = self.header.tensors
        with open(self.path, "rb") as handle:
            self._map = mmap.mmap(handle.fileno(), self.header.size, access=mmap.ACCESS_COPY)
        anchor = ctypes.c_char.from_buffer(self._map)  # its address; the export ends with it
        self._base = ctypes.addressof(anchor)
        del anchor
        _MAPPINGS.add(self._base, self.header.size, self._map)

    @property
    def architecture(self) -> str:
        return self.header.architecture

    def array(self, key: str) -> list[Any]:
        """Every element of the metadata array ``key``, decoded (``metadata`` holds only the
        length of a string array or of a long numeric one): the vocabulary
        (``tokenizer.ggml.tokens``), the merges, the token types...

        Raises:
            KeyError: The file has no such key.
            GGUFFormatError: ``key`` is not an array.
        """
        if key not in self.header.metadata:
            raise KeyError(key)
        start = self.header.array_starts.get(key)
        if start is None:
            raise GGUFFormatError(f"{self.path}: metadata {key!r} is not an array")
        parser = _Parser(self.path, self._map, self.header.size)
        parser.pos = start
        return list(parser.array(decode=True))

    def _torch_view(self, start: int, count: int) -> torch.Tensor:
        import torch

        with warnings.catch_warnings():  # a copy-on-write map is writable: nothing to warn
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(self._map, dtype=torch.uint8, count=count, offset=start)

    def tensor(self, name: str) -> torch.Tensor:
        """``(rows, row_bytes)`` uint8 view of a tensor's bytes in the file's map, not a copy
        (``rows`` = the product of every dimension but the last; one row of a linear weight
        is one output feature, its blocks). The view keeps the map alive."""
        info = self.tensors[name]
        return self._torch_view(info.start, info.nbytes).view(info.rows, -1)

    def raw(self, name: str) -> np.ndarray:
        """The same bytes as :meth:`tensor`, as a numpy view of the map."""
        info = self.tensors[name]
        view = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.start)
        return view.reshape(info.rows, info.nbytes // info.rows)

    def floats(self, name: str) -> np.ndarray:
        """A tensor de-quantized to float32, in its torch shape (a fresh array)."""
        info = self.tensors[name]
        data = self.raw(name)
        if info.ggml_type in FLOAT_TYPES:
            values = data.view(FLOAT_TYPES[info.ggml_type]).astype(np.float32)
        elif info.ggml_type == GGML_BF16:
            values = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import dequantize

            values = dequantize(data, GGMLQuantizationType(info.ggml_type)).astype(
                np.float32, copy=False)
        return values.reshape(info.shape)
