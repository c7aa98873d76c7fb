"""Saving a vector store without pickle: safetensors + JSON, checksummed, written atomically.

Layout inside the folder given to ``save_local`` (several ``index_name``\\ s can share it)::

    {name}.ascend.json              pointer: format, version, current generation, its checksum
    {name}.ascend-{generation}/     one complete save
        manifest.json               format version, config, size + sha256 of every file
        vectors.safetensors         "vectors" (N, D) and, for IVF, "centroids", "assignments";
                                    for faiss, "faiss_labels"
        docstore.json               documents in row order: id, page_content, metadata
        index.faiss                 the faiss index (faiss backend only)

A save writes the generation into a hidden temporary folder, fsyncs it, renames it into place,
then atomically replaces the pointer (``os.replace``) and only then deletes older
generations. A crash at any point leaves the pointer naming a complete generation: the old one
until the replace, the new one after it. Saves into one folder take turns (threads and
processes, :mod:`.folder_lock`); a load meanwhile needs no lock: when the generation it was
reading is deleted by a newer save, it reads the one the pointer names now.

Metadata values JSON cannot hold exactly (tuples, sets, datetimes, bytes, non-string dict
keys) are stored as tagged objects and restored on load; numpy scalars become Python numbers.
Anything else is refused at save time, before anything is written.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_ascend.errors import ChecksumMismatchError, IndexFormatError, VectorStoreInputError
from langchain_ascend.index.persist.folder_lock import save_lock

if TYPE_CHECKING:
    import torch

FORMAT_NAME = "langchain-ascend-faiss"
FORMAT_VERSION = 1
VECTORS_FILE = "vectors.safetensors"
DOCSTORE_FILE = "docstore.json"
FAISS_FILE = "index.faiss"
MANIFEST_FILE = "manifest.json"
_TAG = "__langchain_ascend__"


@dataclass
class SavedIndex:
    """Everything a store writes, independent of files.

    Attributes:
        config: JSON-able store settings (distance strategy, index type, dimension...).
        documents: One dict per row, in row order: ``id``, ``page_content``, ``metadata``.
        tensors: Named tensors for ``vectors.safetensors``.
        faiss_bytes: Serialised faiss index, or None.
    """

    config: dict[str, Any]
    documents: list[dict[str, Any]]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    faiss_bytes: bytes | None = None


def pointer_path(folder: Path, index_name: str) -> Path:
    """The pointer file of ``index_name`` in ``folder``."""
    return folder / f"{index_name}.ascend.json"


def has_saved_index(folder: Path, index_name: str) -> bool:
    """Whether ``folder`` holds a save of ours under ``index_name``."""
    return pointer_path(folder, index_name).is_file()


# ---- metadata encoding --------------------------------------------------------------------
def encode_value(value: Any, where: str) -> Any:
    """JSON-able form of a metadata value (tagged where plain JSON would lose the type).

    Raises:
        VectorStoreInputError: The value has a type this format cannot store.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value) and _TAG not in value:
            return {key: encode_value(item, f"{where}[{key!r}]") for key, item in value.items()}
        return {_TAG: "dict", "items": [[encode_value(k, where), encode_value(v, where)]
                                        for k, v in value.items()]}
    if isinstance(value, list):
        return [encode_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, (tuple, set, frozenset)):
        items = value if isinstance(value, tuple) else sorted(value, key=repr)
        return {_TAG: type(value).__name__, "items": [encode_value(v, where) for v in items]}
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "value": value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG: "date", "value": value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG: "time", "value": value.isoformat()}
    if isinstance(value, (bytes, bytearray)):
        return {_TAG: "bytes", "value": base64.b64encode(bytes(value)).decode("ascii")}
    hint = ""
    if type(value).__module__ == "numpy":
        if getattr(value, "ndim", None) == 0:  # a numpy scalar (or 0-d array): its number
            return encode_value(value.item(), where)
        hint = " (convert a numpy array with .tolist())"
    raise VectorStoreInputError(
        f"cannot save metadata value {where} of type {type(value).__name__}: use JSON types, "
        f"tuples, sets, bytes or datetimes{hint}")


def decode_value(value: Any) -> Any:
    """Inverse of :func:`encode_value`."""
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {key: decode_value(item) for key, item in value.items()}
    if tag == "dict":
        return {decode_value(k): decode_value(v) for k, v in value["items"]}
    if tag in ("tuple", "set", "frozenset"):
        items = [decode_value(v) for v in value["items"]]
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "datetime":
        return dt.datetime.fromisoformat(value["value"])
    if tag == "date":
        return dt.date.fromisoformat(value["value"])
    if tag == "time":
        return dt.time.fromisoformat(value["value"])
    if tag == "bytes":
        return base64.b64decode(value["value"])
    raise IndexFormatError(f"unknown tagged value {tag!r} in docstore.json")


# ---- writing ------------------------------------------------------------------------------
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _file_payloads(saved: SavedIndex) -> dict[str, bytes]:
    from safetensors.torch import save as save_tensors

    documents = [
        {"id": doc["id"], "page_content": doc["page_content"],
         "metadata": encode_value(doc.get("metadata") or {}, f"of document {doc['id']!r}")}
        for doc in saved.documents
    ]
    tensors = {name: t.detach().contiguous().cpu() for name, t in saved.tensors.items()}
    files = {
        VECTORS_FILE: save_tensors(tensors, metadata={"format": FORMAT_NAME}),
        DOCSTORE_FILE: json.dumps({"documents": documents}, ensure_ascii=False).encode("utf-8"),
    }
    if saved.faiss_bytes is not None:
        files[FAISS_FILE] = saved.faiss_bytes
    return files


def save_folder(folder: Path, index_name: str, saved: SavedIndex) -> Path:
    """Write ``saved`` atomically under ``folder``; returns the generation folder.

    Raises:
        VectorStoreInputError: Metadata that cannot be stored (nothing is written).
    """
    payloads = _file_payloads(saved)  # may raise before touching the disk
    folder.mkdir(parents=True, exist_ok=True)
    with save_lock(folder):  # one save at a time: threads and processes (see .folder_lock)
        generation = f"{index_name}.ascend-{uuid.uuid4().hex[:16]}"
        manifest_bytes = _write_generation(folder, generation, saved.config, payloads)
        pointer = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                   "generation": generation, "manifest_sha256": _sha256(manifest_bytes)}
        pointer_tmp = folder / f".{index_name}.ascend.json.{generation}.tmp"
        try:
            _write_durably(pointer_tmp, json.dumps(pointer, indent=1).encode("utf-8"))
            os.replace(pointer_tmp, pointer_path(folder, index_name))
        except BaseException:  # the pointer still names the previous save: drop this one
            pointer_tmp.unlink(missing_ok=True)
            shutil.rmtree(folder / generation, ignore_errors=True)
            raise
        _fsync_dir(folder)
        _remove_stale(folder, index_name, keep=generation)
    return folder / generation


def _write_generation(folder: Path, generation: str, config: dict[str, Any],
                      payloads: dict[str, bytes]) -> bytes:
    """Write the files and manifest of ``generation`` in a hidden staging folder, then rename
    it into place; returns the manifest bytes. Nothing is left behind on failure."""
    staging = folder / f".{generation}.tmp"
    staging.mkdir()
    try:
        files = {}
        for name, data in payloads.items():
            _write_durably(staging / name, data)
            files[name] = {"bytes": len(data), "sha256": _sha256(data)}
        manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                    "config": config, "files": files}
        manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
        _write_durably(staging / MANIFEST_FILE, manifest_bytes)
        _fsync_dir(staging)
        os.rename(staging, folder / generation)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest_bytes


def _remove_stale(folder: Path, index_name: str, keep: str) -> None:
    """Delete the generations of ``index_name`` other than ``keep``, and what killed saves
    left (:func:`remove_abandoned_staging`). The caller holds the save lock, so no other
    save is between writing its generation and its pointer; a hidden staging folder is
    left alone until it is old, as it may belong to a save that does not take the lock."""
    for entry in folder.iterdir():
        if entry.name != keep and entry.name.startswith(f"{index_name}.ascend-"):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    remove_abandoned_staging(folder, index_name)


# A staging folder this old belongs to a save that died (a live save renames its staging
# folder within seconds); younger ones may belong to a save running in another process.
ABANDONED_STAGING_AGE_S = 600.0


def remove_abandoned_staging(folder: Path, index_name: str, *,
                             min_age_s: float = ABANDONED_STAGING_AGE_S) -> list[str]:
    """Delete what killed saves of ``index_name`` left behind (hidden ``.tmp`` staging
    folders and pointer files older than ``min_age_s``); best effort, returns the names."""
    import time

    prefixes = (f".{index_name}.ascend-", f".{index_name}.ascend.json.")
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(prefixes) and entry.name.endswith(".tmp")):
            continue
        try:
            if now - entry.stat().st_mtime < min_age_s:
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
        except OSError:
            continue
    return removed


# ---- reading ------------------------------------------------------------------------------
def _read_bytes(path: Path, missing: str) -> bytes:
    """``path``'s bytes; gone (never written, or a save's cleanup deleted it between the
    check and the read) is an ``IndexFormatError`` saying ``missing`` (a load then retries)."""
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise IndexFormatError(missing) from None


def _read_json(path: Path, what: str) -> Any:
    data = _read_bytes(path, f"{what} {path} is missing")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{what} {path} is not valid JSON (truncated or corrupted): "
                               f"{exc}") from exc


def _check_format(doc: Any, path: Path) -> None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{path} is not a {FORMAT_NAME} file")
    version = doc.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise IndexFormatError(f"{path} has an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise IndexFormatError(
            f"{path} was written by format version {version}; this langchain-ascend reads up "
            f"to version {FORMAT_VERSION}: upgrade langchain-ascend")


def load_folder(folder: Path, index_name: str, *, device: Any = "cpu") -> SavedIndex:
    """Read and verify the current generation of ``index_name`` in ``folder``.

    A save running meanwhile may replace the pointer and delete the generation being read;
    the read then starts over on the generation the pointer names now (no lock needed, so a
    read-only folder loads).

    Raises:
        IndexFormatError: Missing, truncated or unreadable files, or a newer format version.
        ChecksumMismatchError: A file's bytes differ from the recorded checksum.
    """
    for attempt in range(1, _LOAD_ATTEMPTS + 1):
        pointer = _read_pointer(folder, index_name)
        gen_dir = folder / pointer["generation"]
        try:
            manifest, payloads = _read_generation(gen_dir, pointer, index_name)
            break
        except IndexFormatError:
            if attempt == _LOAD_ATTEMPTS or _read_pointer(folder, index_name) == pointer:
                raise  # not a save moving on: the files are damaged
    with save_lock(folder, blocking=False) as no_save_running:
        if no_save_running:
            remove_abandoned_staging(folder, index_name)
    return SavedIndex(
        config=dict(manifest.get("config") or {}),
        documents=_parse_documents(payloads[DOCSTORE_FILE], gen_dir / DOCSTORE_FILE),
        tensors=_parse_tensors(payloads[VECTORS_FILE], gen_dir / VECTORS_FILE, device),
        faiss_bytes=payloads.get(FAISS_FILE),
    )


# Reads restarted when saves keep replacing the generation being read.
_LOAD_ATTEMPTS = 8


def _read_pointer(folder: Path, index_name: str) -> dict[str, Any]:
    pointer_file = pointer_path(folder, index_name)
    pointer = _read_json(pointer_file, "index pointer")
    _check_format(pointer, pointer_file)
    generation = pointer.get("generation")
    if not isinstance(generation, str) or "/" in generation or generation.startswith("."):
        raise IndexFormatError(f"{pointer_file} names an invalid generation {generation!r}")
    return pointer


def _read_generation(gen_dir: Path, pointer: dict[str, Any],
                     index_name: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and verified file bytes of the generation ``pointer`` names."""
    manifest_file = gen_dir / MANIFEST_FILE
    manifest_bytes = _read_bytes(manifest_file,
                                 f"saved index folder {gen_dir} is missing or incomplete")
    if _sha256(manifest_bytes) != pointer.get("manifest_sha256"):
        raise ChecksumMismatchError(f"{manifest_file} does not match the checksum in "
                                    f"{pointer_path(gen_dir.parent, index_name).name}")
    manifest = _read_json(manifest_file, "manifest")
    _check_format(manifest, manifest_file)
    files = manifest.get("files")
    if not isinstance(files, dict) or VECTORS_FILE not in files or DOCSTORE_FILE not in files:
        raise IndexFormatError(f"{manifest_file} does not list the vector and document files")
    return manifest, {name: _verified_bytes(gen_dir / name, info) for name, info in files.items()}


def _verified_bytes(path: Path, info: Any) -> bytes:
    if not isinstance(info, dict):
        raise IndexFormatError(f"manifest entry for {path.name} is malformed")
    data = _read_bytes(path, f"{path} is missing from the saved index")
    if len(data) != info.get("bytes"):
        raise IndexFormatError(
            f"{path} is truncated or padded: {len(data)} bytes, expected {info.get('bytes')}")
    if _sha256(data) != info.get("sha256"):
        raise ChecksumMismatchError(f"{path} does not match its recorded sha256 checksum")
    return data


def _parse_documents(data: bytes, path: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(data)
        rows = doc["documents"]
        return [{"id": str(row["id"]), "page_content": str(row["page_content"]),
                 "metadata": decode_value(row.get("metadata") or {})} for row in rows]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise IndexFormatError(f"{path} is not a valid document file: {exc}") from exc


def _parse_tensors(data: bytes, path: Path, device: Any) -> dict[str, torch.Tensor]:
    from safetensors.torch import load as load_tensors

    try:
        tensors = load_tensors(data)
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types
        raise IndexFormatError(f"{path} is not a valid safetensors file: {exc}") from exc
    return {name: t.to(device) for name, t in tensors.items()}
