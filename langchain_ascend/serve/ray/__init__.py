"""The server as a Ray Serve application (the ``ray`` extra): ``build_ray_app``.

:mod:`~langchain_ascend.serve.ray.routing` (the routing key and the replica ranking),
:mod:`~langchain_ascend.serve.ray.asgi_call` and :mod:`~langchain_ascend.serve.ray.merge`
need no Ray; :mod:`~langchain_ascend.serve.ray.ray_app` and the deployments do, so this package
imports them only when :func:`build_ray_app` is called.
"""

from __future__ import annotations

from typing import Any

from langchain_ascend.errors import MissingExtraError
from langchain_ascend.extras import RAY, install_hint

__all__ = ["MISSING_EXTRA", "build_ray_app"]

MISSING_EXTRA = f"the Ray Serve application needs Ray Serve: {install_hint(RAY)}"


def build_ray_app(*args: Any, **kwargs: Any) -> Any:
    """See :func:`langchain_ascend.serve.ray.ray_app.build_ray_app` (imports Ray on first use)."""
    try:
        from langchain_ascend.serve.ray.ray_app import build_ray_app as build
    except ImportError as error:
        if "ray" not in str(error).lower():
            raise
        raise MissingExtraError(f"{MISSING_EXTRA} ({error})") from error
    return build(*args, **kwargs)
