"""The one way the CPU preparation replaces a module's ``forward``, and the one marker it leaves.

The model code and its parameters stay as they are; a prepared module instance gets its own
``forward`` (an instance attribute shadowing the class's) and :data:`MARKER`, whose value says
who swapped it: a name, or the state the new forward shares (a fused projection group).

While ``torch.compile`` traces the model (``torch.compiler.is_compiling()``), a swapped module
runs its class's ``forward`` instead: the prepared forwards call native kernels through
ctypes, which the tracer cannot follow, while the class code is plain torch that compiles to
one graph (the compiled static decode step, ``engine.worker.compile``). Eagerly, the check
costs one call per module.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

MARKER = "_langchain_ascend_forward"
"""Instance attribute of a module whose ``forward`` was swapped: who swapped it."""


def swap_forward(module: Any, forward: Callable[..., Any], owner: Any) -> None:
    """Give ``module`` the instance ``forward`` (``forward(module, *args)``), marked ``owner``;
    under ``torch.compile`` the class's ``forward`` runs (module docstring)."""
    import torch

    compiling = torch.compiler.is_compiling
    class_forward = type(module).forward

    def dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling():
            return class_forward(self, *args, **kwargs)
        return forward(self, *args, **kwargs)

    module.__dict__["forward"] = types.MethodType(dispatch, module)
    module.__dict__[MARKER] = owner


def restore_forward(module: Any) -> None:
    """Back to the class's ``forward``; the marker goes."""
    module.__dict__.pop("forward", None)
    module.__dict__.pop(MARKER, None)


def swapped_by(module: Any) -> Any:
    """Who swapped ``module``'s ``forward`` (:func:`swap_forward`'s ``owner``), or None."""
    return module.__dict__.get(MARKER)


def is_swapped(module: Any) -> bool:
    """Whether ``module`` has an instance ``forward`` (ours, or anyone else's)."""
    return "forward" in module.__dict__ or MARKER in module.__dict__
