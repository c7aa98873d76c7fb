"""Small helpers the GGUF cache and the conversion share: library versions, progress bars."""

from __future__ import annotations

from importlib import metadata
from typing import Any


def package_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``"absent"``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def progress_bar(enabled: bool, **kwargs: Any) -> Any:
    """A tqdm bar built with ``kwargs`` when ``enabled``, else ``None``."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kwargs)
