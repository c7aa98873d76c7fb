"""Where a model source points: a local HF folder, a GGUF file (or a folder of them), or a hub
id found in the local Hugging Face cache (downloaded when the hub is reachable).

Nothing here converts; a GGUF file is only checked for its magic bytes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Literal

from langchain_ascend.engine.model_source.gguf_header import check_gguf_magic
from langchain_ascend.errors import ModelSourceError

SourceKind = Literal["folder", "gguf", "hub"]

# Files whose presence means a folder carries model weights transformers can load.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]$")
_OFFLINE_VALUES = frozenset({"1", "on", "yes", "true"})


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
class Located:
    """Where a model source points, before any conversion or download."""

    kind: SourceKind
    target: Path  # the folder (folder/hub) or the GGUF file (gguf)



def source_string(model: object) -> str:
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


def locate(source: str, gguf_file: str | None, *, download: bool) -> Located:
    path = Path(source).expanduser()
    if path.is_file():
        if gguf_file is not None and Path(gguf_file).name != path.name:
            raise ModelSourceError(
                f"model={source!r} is a file and gguf_file={gguf_file!r} names another one; "
                "expected gguf_file only with a folder (or the same file's name)")
        check_gguf_magic(path)
        return Located("gguf", path.resolve())
    if path.is_dir():
        return _classify_folder(path.resolve(), gguf_file, kind="folder")
    if path.exists():
        raise ModelSourceError(
            f"{source} is neither a file nor a folder; expected a model folder or a .gguf file")
    if _looks_like_hub_id(source):
        snapshot = _hub_snapshot(source, gguf_file, download=download)
        if snapshot is None:  # check only, not cached, hub reachable: resolve will download
            return Located("hub", path)
        return _classify_folder(snapshot, gguf_file, kind="hub")
    raise ModelSourceError(
        f"model path {source} does not exist; expected a local model folder (with "
        "config.json), a .gguf file, a folder of .gguf files, or a hub id 'org/name'")


def _classify_folder(folder: Path, gguf_file: str | None, *, kind: SourceKind) -> Located:
    ggufs = sorted(p.name for p in folder.iterdir()
                   if p.is_file() and p.name.lower().endswith(".gguf"))
    if gguf_file is not None:
        pick = folder / gguf_file
        if not pick.is_file():
            listing = ", ".join(ggufs) if ggufs else "none"
            raise ModelSourceError(
                f"gguf_file={gguf_file!r} is not a file in {folder}; expected one of its GGUF "
                f"files: {listing}")
        check_gguf_magic(pick)
        return Located("gguf", pick.resolve())
    if (folder / "config.json").is_file():
        if not _has_weights(folder):
            raise ModelSourceError(
                f"model folder {folder} has config.json but no weights; expected "
                "*.safetensors or pytorch_model.bin files (or an index of shards) next to it")
        return Located(kind, folder)
    if len(ggufs) == 1:
        pick = folder / ggufs[0]
        check_gguf_magic(pick)
        return Located("gguf", pick.resolve())
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
