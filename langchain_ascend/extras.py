"""Optional dependencies, imported where a feature needs them, with an error naming the extra
that installs them (``pip install 'langchain-ascend[plot]'``) instead of a bare ImportError."""

from __future__ import annotations

import importlib
from types import ModuleType

from langchain_ascend.errors import MissingExtraError

PLOT = "plot"
"""matplotlib: ``AscendTimeline.write_png`` and the demo's ``--out`` chart."""
SERVE = "serve"
"""FastAPI, uvicorn, prometheus-client: ``langchain-ascend serve`` and its app."""
RAY = "ray"
"""Ray Serve: ``langchain-ascend serve --ray`` (:mod:`langchain_ascend.serve.ray`)."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'langchain-ascend[{extra}]'"


def import_extra(module: str, *, extra: str, feature: str) -> ModuleType:
    """``import module``, or a :class:`~langchain_ascend.errors.MissingExtraError` saying that
    ``feature`` needs it and how to install it.

    Args:
        module: The module to import (``"matplotlib"``).
        extra: The package extra that installs it (``"plot"``).
        feature: What needs it, for the message (``"AscendTimeline.write_png"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs {module}, which is not installed: {install_hint(extra)}"
        ) from exc
