"""A model's readable name for ``response_metadata["model_name"]`` and LangSmith's
``ls_model_name``: never a filesystem path when the model says who it is.

In order: a hub id as given (``"Qwen/Qwen2.5-7B-Instruct"``); the ``org/name`` of a Hugging
Face cache snapshot folder (``…/models--org--name/snapshots/<sha>``); a GGUF file's
``general.name``; an HF folder's ``config.json`` ``_name_or_path`` when that is a hub id, not
a path; else the file's or folder's stem. Reads a config or a GGUF header once per model
(cached); no torch, nothing loaded.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from langchain_ascend.engine.model_source import inspect_gguf
from langchain_ascend.errors import ModelSourceError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]$")
_SNAPSHOT = re.compile(r"^models--([^/]+?)--(.+)$")


def _hub_id_of_snapshot(path: Path) -> str | None:
    """``org/name`` of a path inside a Hugging Face cache repository folder, else None."""
    for part in path.parts:
        match = _SNAPSHOT.match(part)
        if match is not None:
            return f"{match.group(1)}/{match.group(2).replace('--', '/')}"
    return None


def _gguf_name(path: Path) -> str:
    """``general.name`` of a GGUF file, else its stem."""
    try:
        name = inspect_gguf(path).name
    except ModelSourceError:
        name = None
    return name.strip() if isinstance(name, str) and name.strip() else path.stem


def _config_name(folder: Path) -> str | None:
    """``_name_or_path`` of the folder's ``config.json`` when it names a hub id."""
    try:
        value = json.loads((folder / "config.json").read_text(encoding="utf-8")).get(
            "_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, str) and _HUB_ID.match(value) and not Path(value).exists():
        return value
    return None


@functools.lru_cache(maxsize=128)
def readable_model_name(model: str, gguf_file: str | None = None) -> str:
    """The readable name of ``model`` (as given to ``AscendChatModel(model=...)``).

    Args:
        model: A local folder, a ``.gguf`` file, a folder of GGUF files, or a hub id.
        gguf_file: The GGUF file chosen in a folder of several.

    Returns:
        See the module docstring; ``model`` itself when it is no local path.
    """
    path = Path(model).expanduser()
    if not path.exists():
        return model
    hub_id = _hub_id_of_snapshot(path.resolve())
    if hub_id is not None:
        return hub_id
    if path.is_file():
        return _gguf_name(path)
    if gguf_file is not None:
        return _gguf_name(path / gguf_file)
    named = _config_name(path)
    if named is not None:
        return named
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").is_file() and len(ggufs) == 1:
        return _gguf_name(ggufs[0])
    return path.name
