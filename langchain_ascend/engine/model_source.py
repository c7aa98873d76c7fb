"""Where a model's weights come from: a local HF folder, a GGUF file, or a hub id.

The engine loads a plain Hugging Face folder (``config.json``, weights, tokenizer files).
:func:`resolve_model_source` turns whatever the user named into such a folder:

- a local folder with ``config.json`` (and weights) is used as it is (kind ``"folder"``);
- a ``.gguf`` file, or a folder holding GGUF files, is de-quantized once through
  transformers' GGUF loader into float32 safetensors plus its tokenizer and generation config,
  cached under ``$LANGCHAIN_ASCEND_CACHE/gguf`` (default ``~/.cache/langchain_ascend/gguf``)
  and keyed by the file's sha256 and the transformers version (kind ``"gguf"``);
- an ``org/name`` string that is not a local path is looked up in the local Hugging Face cache
  (downloaded when the hub is not switched off with ``HF_HUB_OFFLINE`` /
  ``TRANSFORMERS_OFFLINE``) and its snapshot folder classified as above (kind ``"hub"`` for an
  HF folder, ``"gguf"`` when the snapshot holds GGUF files).

:func:`check_model_source` runs the same checks without converting or downloading anything —
cheap enough for a constructor. Every failure is a :class:`~langchain_ascend.errors.
ModelSourceError` whose message names the path or value and what was expected there.

The GGUF header is read by a small parser of our own (the format's fixed layout: magic,
version, key/value metadata, tensor table) instead of ``gguf.GGUFReader``, which builds numpy
views of every metadata array and takes seconds on a 49k-token vocabulary; ours skips the
arrays, and also checks that every tensor's data lies inside the file, which catches a
truncated download. The ``gguf`` package supplies the value-type and quantization-size tables.

Cache layout (one folder per converted file; its existence means "complete")::

    <cache>/gguf/<stem>-<sha256[:16]>-tf<transformers version>-v<CONVERTER_VERSION>/
        config.json  model.safetensors  generation_config.json
        tokenizer.json  tokenizer_config.json  chat_template.jinja ...
        source.json  (what it was converted from, and with which versions)
    <cache>/gguf/index.json  (path, size, mtime -> sha256: skips re-hashing an unchanged file)

A conversion writes into a temporary folder next to its final place and renames it into place
under an advisory ``fcntl`` lock, so two processes never convert the same file twice, and a
reader never sees half a folder; where ``fcntl`` is missing the rename race is still safe.

Example:
    >>> resolved = resolve_model_source("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
    >>> resolved.kind, resolved.path.name  # doctest: +SKIP
    ('gguf', 'SmolLM2-135M-Instruct.Q4_1-3c1f...-tf5.23.0-v1')
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from langchain_ascend.errors import ModelSourceError

# The same variable as ``langchain_ascend.testing.cache.CACHE_ENV_VAR`` (a test keeps them
# equal); not imported from there so the engine does not depend on the testing package.
CACHE_ENV_VAR = "LANGCHAIN_ASCEND_CACHE"
DEFAULT_CACHE_ROOT = Path("~/.cache/langchain_ascend")
GGUF_CACHE_SUBDIR = "gguf"

# Bump when the conversion writes a different folder for the same file and library versions.
CONVERTER_VERSION = 1

SourceKind = Literal["folder", "gguf", "hub"]

# Files whose presence means a folder carries model weights transformers can load.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# transformers' GGUF table also lists encoder-decoder models; AutoModelForCausalLM loads none.
_NOT_CAUSAL_LM = frozenset({"t5", "t5encoder", "umt5"})
# End-of-turn markers of common chat templates: when the template uses one and the tokenizer
# knows it as a token, generation must stop there even if the GGUF's EOS is another token.
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]$")
_OFFLINE_VALUES = frozenset({"1", "on", "yes", "true"})
_HASH_CHUNK = 8 << 20  # bytes read per step while hashing


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """A model source turned into a local folder the engine can load.

    Attributes:
        path: A local HF folder: ``AutoModelForCausalLM.from_pretrained(path)`` and
            ``AutoTokenizer.from_pretrained(path)`` load it.
        kind: ``"folder"`` (the user's own folder), ``"gguf"`` (a de-quantized GGUF file,
            ``path`` is in the cache) or ``"hub"`` (a snapshot in the Hugging Face cache).
        source: What the user passed, as a string.
        gguf_file: The GGUF file ``path`` was converted from (``kind == "gguf"`` only).
    """

    path: Path
    kind: SourceKind
    source: str
    gguf_file: Path | None = None


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
    """

    path: Path
    version: int
    architecture: str
    name: str | None
    num_tensors: int
    num_elements: int
    metadata_keys: tuple[str, ...]
    size: int

    @property
    def has_tokenizer(self) -> bool:
        """Whether the file embeds a tokenizer vocabulary (transformers needs one)."""
        return "tokenizer.ggml.tokens" in self.metadata_keys

    @property
    def has_chat_template(self) -> bool:
        """Whether the file embeds a chat template (a chat model needs one)."""
        return "tokenizer.chat_template" in self.metadata_keys


@dataclasses.dataclass(frozen=True)
class _Located:
    kind: SourceKind
    target: Path  # the folder (folder/hub) or the GGUF file (gguf)


# ------------------------------------------------------------------------------ public API


def resolve_model_source(
    model: str | os.PathLike[str],
    *,
    gguf_file: str | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ResolvedModel:
    """Turn ``model`` into a local HF folder, de-quantizing a GGUF file once (then cached).

    Args:
        model: A local HF folder, a ``.gguf`` file, a folder holding GGUF files, or a hub id
            ``"org/name"`` that is not a local path.
        gguf_file: Which GGUF file of a folder (or hub snapshot) to use: a file name, or a
            path relative to the folder. Needed when the folder holds several; when given,
            the GGUF file is used even if the folder also has ``config.json``.
        progress: Show tqdm bars while hashing and converting (transformers' own bars too).
        cache_dir: Root of the conversion cache; default ``$LANGCHAIN_ASCEND_CACHE``, else
            ``~/.cache/langchain_ascend``. Conversions go to its ``gguf/`` folder.

    Returns:
        The :class:`ResolvedModel`; for a GGUF source its ``path`` is the cached folder.

    Raises:
        ModelSourceError: The source is missing, is neither an HF folder nor GGUF, is a
            corrupt or truncated GGUF file, has an architecture transformers cannot load from
            GGUF, is a hub id absent from the local cache in offline mode, or its conversion
            failed. The message names the path and what was expected.
    """
    source = _source_string(model)
    located = _locate(source, gguf_file, download=True)
    if located.kind != "gguf":
        return ResolvedModel(path=located.target, kind=located.kind, source=source)
    info = inspect_gguf(located.target)
    _check_architecture(info)
    folder = _converted_folder(info, cache_root=_cache_root(cache_dir), progress=progress)
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
    source = _source_string(model)
    located = _locate(source, gguf_file, download=False)
    if located.kind == "gguf":
        _check_architecture(inspect_gguf(located.target))
    return located.kind


def inspect_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a GGUF file's header: version, metadata keys, architecture, tensor table.

    Only the header is parsed (metadata arrays are skipped, not decoded); the tensor table is
    checked against the file size, so a truncated file is caught here.

    Raises:
        ModelSourceError: The file is missing, empty, not GGUF (bad magic), of an
            unsupported format version or byte order, truncated, or malformed.
    """
    file = Path(path)
    try:
        size = file.stat().st_size
        if size == 0:
            raise _CorruptGGUF("the file is empty")
        with open(file, "rb") as handle, mmap.mmap(handle.fileno(), 0,
                                                   access=mmap.ACCESS_READ) as blob:
            return _parse_header(file, blob, size)
    except _CorruptGGUF as error:
        raise ModelSourceError(
            f"{file} is not a readable GGUF file: {error}; expected a complete GGUF model "
            "file (a truncated download or another format?)") from None
    except OSError as error:
        raise ModelSourceError(f"cannot read GGUF file {file}: {error}") from error


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


def gguf_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder conversions are cached in: ``<cache_dir or $LANGCHAIN_ASCEND_CACHE or
    ~/.cache/langchain_ascend>/gguf`` (not created)."""
    return _cache_root(cache_dir)


# ------------------------------------------------------------------------------ locating


def _source_string(model: object) -> str:
    if not isinstance(model, (str, os.PathLike)):
        raise ModelSourceError(
            f"model={model!r} is a {type(model).__name__}; expected a local folder, a .gguf "
            "file or a hub id 'org/name' (a string or path)")
    source = os.fspath(model)
    if not isinstance(source, str) or not source.strip():
        raise ModelSourceError(
            f"model={source!r} is empty; expected a local folder, a .gguf file or a hub id "
            "'org/name'")
    return source


def _locate(source: str, gguf_file: str | None, *, download: bool) -> _Located:
    path = Path(source).expanduser()
    if path.is_file():
        if gguf_file is not None and Path(gguf_file).name != path.name:
            raise ModelSourceError(
                f"model={source!r} is a file and gguf_file={gguf_file!r} names another one; "
                "expected gguf_file only with a folder (or the same file's name)")
        _check_gguf_magic(path)
        return _Located("gguf", path.resolve())
    if path.is_dir():
        return _classify_folder(path.resolve(), gguf_file, kind="folder")
    if path.exists():
        raise ModelSourceError(
            f"{source} is neither a file nor a folder; expected a model folder or a .gguf file")
    if _looks_like_hub_id(source):
        snapshot = _hub_snapshot(source, gguf_file, download=download)
        if snapshot is None:  # check only, not cached, hub reachable: resolve will download
            return _Located("hub", path)
        return _classify_folder(snapshot, gguf_file, kind="hub")
    raise ModelSourceError(
        f"model path {source} does not exist; expected a local model folder (with "
        "config.json), a .gguf file, a folder of .gguf files, or a hub id 'org/name'")


def _classify_folder(folder: Path, gguf_file: str | None, *, kind: SourceKind) -> _Located:
    ggufs = sorted(p.name for p in folder.iterdir()
                   if p.is_file() and p.name.lower().endswith(".gguf"))
    if gguf_file is not None:
        pick = folder / gguf_file
        if not pick.is_file():
            listing = ", ".join(ggufs) if ggufs else "none"
            raise ModelSourceError(
                f"gguf_file={gguf_file!r} is not a file in {folder}; expected one of its GGUF "
                f"files: {listing}")
        _check_gguf_magic(pick)
        return _Located("gguf", pick.resolve())
    if (folder / "config.json").is_file():
        if not _has_weights(folder):
            raise ModelSourceError(
                f"model folder {folder} has config.json but no weights; expected "
                "*.safetensors or pytorch_model.bin files (or an index of shards) next to it")
        return _Located(kind, folder)
    if len(ggufs) == 1:
        pick = folder / ggufs[0]
        _check_gguf_magic(pick)
        return _Located("gguf", pick.resolve())
    if ggufs:
        raise ModelSourceError(
            f"model folder {folder} holds {len(ggufs)} GGUF files and no gguf_file= picks one; "
            f"expected gguf_file= set to one of: {', '.join(ggufs)}")
    entries = sorted(p.name for p in folder.iterdir())
    shown = ", ".join(entries[:8]) + (", ..." if len(entries) > 8 else "")
    raise ModelSourceError(
        f"model folder {folder} has neither config.json nor a .gguf file (it holds: "
        f"{shown or 'nothing'}); expected a Hugging Face model folder or GGUF files")


def _has_weights(folder: Path) -> bool:
    return any(p.name in _WEIGHT_INDEXES or p.suffix in _WEIGHT_SUFFIXES
               for p in folder.iterdir() if p.is_file())


def _check_gguf_magic(file: Path) -> None:
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


def _looks_like_hub_id(source: str) -> bool:
    return (_HUB_ID.match(source) is not None and ".." not in source
            and not source.lower().endswith(".gguf"))


def _hub_offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in _OFFLINE_VALUES
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_snapshot(repo_id: str, gguf_file: str | None, *, download: bool) -> Path | None:
    """The local snapshot folder of ``repo_id``: from the HF cache, else downloaded when
    ``download`` and the hub is not switched off; ``None`` when only checking, not cached and
    online."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:  # pragma: no cover - a transformers dependency
        raise ModelSourceError(
            f"model={repo_id!r} looks like a hub id, and huggingface_hub is not installed"
        ) from error
    offline = _hub_offline()
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as error:  # noqa: BLE001 - every hub failure becomes our typed error
        if offline:
            raise ModelSourceError(
                f"model {repo_id!r} is not a local path and the hub id is not in the local "
                "Hugging Face cache, and offline mode is on (HF_HUB_OFFLINE / "
                "TRANSFORMERS_OFFLINE); expected a local folder or .gguf file, or a model "
                "downloaded beforehand") from error
        if not download:
            return None
    patterns: dict[str, Any] = {}
    if gguf_file is not None:  # a GGUF repository holds many quantizations: fetch the one
        patterns["allow_patterns"] = [gguf_file]
    else:
        patterns["ignore_patterns"] = ["*.gguf", "*.pth", "*.pt", "*.onnx", "*.h5",
                                       "*.msgpack", "*.ot", "original/*", "onnx/*"]
    try:
        return Path(snapshot_download(repo_id, **patterns))
    except Exception as error:  # noqa: BLE001 - every hub failure becomes our typed error
        raise ModelSourceError(
            f"model {repo_id!r} is not a local path, and downloading it as a hub id failed "
            f"({type(error).__name__}: {error}); expected a local folder, a .gguf file or a "
            "reachable hub repository") from error


# ------------------------------------------------------------------------------ GGUF header


class _CorruptGGUF(Exception):
    """Internal: the header parser hit something a valid GGUF file cannot contain."""


class _Cursor:
    """Little-endian reads from a memory map, every read bounds-checked."""

    def __init__(self, blob: mmap.mmap, size: int) -> None:
        self.blob, self.size, self.pos = blob, size, 0

    def take(self, fmt: str) -> Any:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise _CorruptGGUF(f"the header ends early (byte {self.pos} of {self.size}): "
                               "the file is truncated")
        (value,) = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += width
        return value

    def skip(self, num_bytes: int) -> None:
        if num_bytes < 0 or self.pos + num_bytes > self.size:
            raise _CorruptGGUF(f"a header field runs past the end of the file (byte "
                               f"{self.pos} + {num_bytes} > {self.size}): the file is truncated")
        self.pos += num_bytes

    def string(self) -> str:
        length = self.take("<Q")
        start = self.pos
        self.skip(length)
        try:
            return bytes(self.blob[start:self.pos]).decode("utf-8")
        except UnicodeDecodeError as error:
            raise _CorruptGGUF(f"a header string at byte {start} is not UTF-8") from error


def _parse_header(file: Path, blob: mmap.mmap, size: int) -> GGUFInfo:
    from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUFValueType

    scalar = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
              GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
              GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
              GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}

    def value_type(code: int) -> GGUFValueType:
        try:
            return GGUFValueType(code)
        except ValueError:
            raise _CorruptGGUF(f"unknown metadata value type {code} at byte {cur.pos}") from None

    def read_value(kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return cur.string()
        if kind == GGUFValueType.ARRAY:  # skipped: element type, count, then the elements
            item = value_type(cur.take("<I"))
            count = cur.take("<Q")
            if item == GGUFValueType.STRING:
                for _ in range(count):
                    cur.skip(cur.take("<Q"))
            elif item == GGUFValueType.ARRAY:
                for _ in range(count):
                    read_value(GGUFValueType.ARRAY)
            else:
                cur.skip(count * struct.calcsize(scalar[item]))
            return None
        return cur.take(scalar[kind])

    cur = _Cursor(blob, size)
    if size < 4 or bytes(blob[:4]) != b"GGUF":
        raise _CorruptGGUF("it does not start with the GGUF magic bytes")
    cur.pos = 4
    version = cur.take("<I")
    if version not in (2, 3):
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        detail = ("it is big-endian" if swapped in (2, 3)
                  else f"format version {version} is not 2 or 3")
        raise _CorruptGGUF(detail)
    num_tensors = cur.take("<Q")
    num_keys = cur.take("<Q")
    keys: list[str] = []
    strings: dict[str, Any] = {}
    for _ in range(num_keys):
        key = cur.string()
        value = read_value(value_type(cur.take("<I")))
        keys.append(key)
        if key in ("general.architecture", "general.name", "general.alignment"):
            strings[key] = value
    architecture = strings.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise _CorruptGGUF("it has no general.architecture metadata")
    alignment = strings.get("general.alignment") or GGUF_DEFAULT_ALIGNMENT
    if not isinstance(alignment, int) or alignment <= 0:
        raise _CorruptGGUF(f"general.alignment={alignment!r} is not a positive integer")
    data_end = 0  # bytes of tensor data the table asks for, from the data section's start
    total_elements = 0
    for _ in range(num_tensors):
        name = cur.string()
        num_dims = cur.take("<I")
        num_elements = 1
        for _ in range(num_dims):
            num_elements *= cur.take("<Q")
        type_code = cur.take("<I")
        offset = cur.take("<Q")
        block = GGML_QUANT_SIZES.get(_ggml_type(type_code))
        if block is None:
            raise _CorruptGGUF(f"tensor {name!r} has unknown ggml type {type_code}")
        block_size, type_size = block
        total_elements += num_elements
        data_end = max(data_end, offset + num_elements // block_size * type_size)
    data_start = -(-cur.pos // alignment) * alignment
    if data_start + data_end > size:
        raise _CorruptGGUF(f"its tensors need {data_start + data_end} bytes and the file has "
                           f"{size}: the file is truncated")
    name_value = strings.get("general.name")
    return GGUFInfo(path=file, version=version, architecture=architecture,
                    name=name_value if isinstance(name_value, str) else None,
                    num_tensors=num_tensors, num_elements=total_elements,
                    metadata_keys=tuple(keys), size=size)


def _ggml_type(code: int) -> Any:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(code)
    except ValueError:
        return None


def _architecture_candidates(architecture: str) -> set[str]:
    """The names transformers' loader may map a llama.cpp architecture to (``qwen2moe`` ->
    ``qwen2_moe``, ``gpt-oss`` -> ``gpt_oss``...)."""
    underscored = architecture.replace("-", "_")
    return {architecture, underscored, re.sub(r"moe$", "_moe", underscored)}


def _check_architecture(info: GGUFInfo) -> None:
    candidates = _architecture_candidates(info.architecture)
    if candidates & _legacy_gguf_architectures():
        supported: frozenset[str] = frozenset()
    else:  # the newer loader's table imports torch: consulted only when needed
        supported = supported_gguf_architectures()
    if supported and not candidates & supported:
        raise ModelSourceError(
            f"{info.path} holds a {info.architecture!r} model (general.architecture), which "
            f"transformers {_version('transformers')} cannot load from GGUF as a causal LM; "
            f"expected one of: {', '.join(sorted(supported))}")
    if not info.has_tokenizer:
        raise ModelSourceError(
            f"{info.path} embeds no tokenizer (no tokenizer.ggml.tokens metadata); expected a "
            "GGUF model file with its vocabulary, as llama.cpp's converter writes")


# ------------------------------------------------------------------------------ cache


def _cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    chosen = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV_VAR)
    root = Path(chosen) if chosen else DEFAULT_CACHE_ROOT
    return root.expanduser().resolve() / GGUF_CACHE_SUBDIR


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def cache_key(sha256: str, gguf_name: str) -> str:
    """The cache folder name of a GGUF file: its stem, content hash, the transformers version
    and :data:`CONVERTER_VERSION` — a new transformers converts anew."""
    stem = re.sub(r"[^\w.-]", "_", Path(gguf_name).stem)[:80] or "model"
    return f"{stem}-{sha256[:16]}-tf{_version('transformers')}-v{CONVERTER_VERSION}"


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic renames alone keep readers safe
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def file_sha256(path: Path, *, progress: bool = False) -> str:
    """The sha256 of a file's content, read in 8 MiB chunks (a tqdm bar when ``progress``)."""
    digest = hashlib.sha256()
    bar = _progress_bar(progress, total=path.stat().st_size, unit="B", unit_scale=True,
                        desc=f"Hashing {path.name}")
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return digest.hexdigest()


def _stat_key(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def _cached_sha256(path: Path, root: Path, *, progress: bool) -> str:
    """``path``'s sha256, taken from ``root/index.json`` when the file's (size, mtime, inode)
    are those recorded with it (a file rewritten in place changes its mtime), else hashed and
    recorded. A broken index is ignored and rewritten."""
    index_path = root / "index.json"
    real = str(path.resolve())
    stamp = _stat_key(path)
    entry = _read_index(index_path).get(real)
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()):
        sha = entry.get("sha256")
        if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
            return sha
    sha = file_sha256(path, progress=progress)
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / ".index.lock"):
        files = _read_index(index_path)
        files[real] = {**stamp, "sha256": sha}
        fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".json", dir=root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"version": 1, "files": files}, handle, indent=1, sort_keys=True)
            os.replace(tmp, index_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return sha


def _read_index(index_path: Path) -> dict[str, Any]:
    try:
        data = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return dict(files) if isinstance(files, dict) else {}


def _is_complete(folder: Path) -> bool:
    return (folder / "source.json").is_file() and (folder / "config.json").is_file()


def _converted_folder(info: GGUFInfo, *, cache_root: Path, progress: bool) -> Path:
    """The cached HF folder of ``info.path``, converting (once, under a lock) when missing."""
    sha = _cached_sha256(info.path, cache_root, progress=progress)
    final = cache_root / cache_key(sha, info.path.name)
    if _is_complete(final):
        return final
    cache_root.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_root / f".{final.name}.lock"):
        if _is_complete(final):  # another process finished it while we waited
            return final
        if final.exists():  # incomplete leftovers (files deleted by hand): set aside
            stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale.", dir=cache_root))
            os.replace(final, stale / "folder")
            shutil.rmtree(stale, ignore_errors=True)
        _check_memory(info)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache_root))
        try:
            _convert_gguf(info.path, tmp, progress=progress)
            if not (tmp / "config.json").is_file():
                raise ModelSourceError(
                    f"converting {info.path} wrote no config.json into {tmp}; expected a "
                    "complete HF folder")
            manifest = {"source_file": str(info.path), "sha256": sha, "size": info.size,
                        "architecture": info.architecture, "name": info.name,
                        "transformers": _version("transformers"), "torch": _version("torch"),
                        "gguf": _version("gguf"), "converter_version": CONVERTER_VERSION}
            (tmp / "source.json").write_text(json.dumps(manifest, indent=2) + "\n",
                                             encoding="utf-8")
            _make_shareable(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not _is_complete(final):  # not a lost race: a real failure
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _check_memory(info: GGUFInfo) -> None:
    """Refuse a conversion that cannot fit: de-quantizing holds every weight in float32, and
    running out of memory kills the process instead of raising."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX: no check
        return
    needed = 4 * info.num_elements
    if physical > 0 and needed > physical:
        raise ModelSourceError(
            f"de-quantizing {info.path} needs {needed / 2**30:.1f} GiB for its float32 weights "
            f"and this machine has {physical / 2**30:.1f} GiB of memory; expected a smaller "
            "model, or an HF folder in a smaller dtype")


def _make_shareable(folder: Path) -> None:
    """World-readable like any cache (``mkdtemp`` makes the folder private)."""
    os.chmod(folder, 0o755)
    for path in folder.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _progress_bar(enabled: bool, **kwargs: Any) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


# ------------------------------------------------------------------------------ conversion


def _convert_gguf(gguf_path: Path, out_dir: Path, *, progress: bool) -> None:
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
    bar = _progress_bar(progress, total=4, desc=f"De-quantizing {gguf_path.name}", unit="step")
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
            f"{_version('transformers')} supports") from error
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
    eos_ids = _eos_token_ids(model.generation_config, tokenizer)
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


def _eos_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """EOS ids to stop at: the generation config's, the tokenizer's, and the end-of-turn token
    of the chat template (``<|im_end|>`` for ChatML...) when the tokenizer has it."""
    ids: list[int] = []
    raw = getattr(generation_config, "eos_token_id", None)
    for value in (raw if isinstance(raw, (list, tuple)) else [raw]):
        if isinstance(value, int):
            ids.append(value)
    if isinstance(tokenizer.eos_token_id, int):
        ids.append(tokenizer.eos_token_id)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    vocab = tokenizer.get_vocab()
    for marker in _END_OF_TURN_TOKENS:
        if marker in template and marker in vocab:
            ids.append(int(vocab[marker]))
    return list(dict.fromkeys(ids))
