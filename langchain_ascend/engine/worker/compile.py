"""How pure-decode steps run: eagerly, as the static step, captured, or compiled.

Prefill and mixed steps always run the runner's eager packed forward. Pure-decode steps go
through the static step (``engine.worker.static_step``) when the plan says so:

=========  ==============================  =========================================
mode       CUDA / NPU                      CPU
=========  ==============================  =========================================
"auto"     static step, graphs captured    eager (no static step; see below)
True       static step, graphs captured    static step compiled with ``torch.compile``
                                           (``fullgraph=True, dynamic=False``, inductor),
                                           one callable per bucket, compiled on first use
"static"   static step, eager              static step, eager
False      eager                           eager
=========  ==============================  =========================================

Graphs (``engine.worker.graphs``) are captured at ``warmup()`` or, without one, at the first
pure-decode step. "auto" on the CPU stays eager: the CPU-prepared model calls native kernels
that are not torch custom ops (``engine.cpu``), so the compiled step would not be one graph,
and no warm-up measurement yet shows a compiled static step faster there.

Any exception while compiling or running a compiled step logs a warning, disables the static
path for good and reruns the step eagerly; the cache writes of the failed attempt are repeated
with the same values, so the retry is harmless. A failed graph capture only sends that bucket
to the eager static step (``graphs``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform

if TYPE_CHECKING:
    import torch

    from langchain_ascend.attention.backends.base import BatchLayout
    from langchain_ascend.engine.worker.graphs import DecodeGraphs
    from langchain_ascend.engine.worker.static_step import Bucket, StaticDecodeStep
    from langchain_ascend.platform import GraphAPI

logger = logging.getLogger(__name__)

MODES = ("auto", True, False, "static")


def resolve_plan(mode: bool | str, device: torch.device) -> str:
    """What runs pure-decode steps for ``mode`` on ``device``: ``"eager"``, ``"static"``,
    ``"graphs"`` or ``"compile"`` (module docstring).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    if mode is False:
        return "eager"
    if mode == "static" and not isinstance(mode, bool):
        return "static"
    if mode == "auto" or mode is True:
        if platform.graph_api(device) is not None:
            return "graphs"
        if mode is True and platform.compile_backend(device) is not None:
            return "compile"
        return "eager"
    raise ValueError(f"compile must be 'auto', 'static', True or False, got {mode!r}")


def resolve_compile(mode: bool | str, device: torch.device) -> bool:
    """Whether ``mode`` captures or compiles the decode step on ``device``.

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    return resolve_plan(mode, device) in ("graphs", "compile")


class StepCompiler:
    """Runs pure-decode steps through the static step, captured or compiled as planned.

    Args:
        static: The runner's static step (None: every step is eager).
        device: Where the model runs.
        mode: See :data:`MODES`.
        compile_fn: Turns the static step function into its compiled form (implies the
            ``"compile"`` plan unless ``mode`` is False); default ``torch.compile(fn,
            backend=platform.compile_backend(device), fullgraph=True, dynamic=False)``.
        graph_api: The graph API to capture with (implies the ``"graphs"`` plan unless
            ``mode`` is False); default ``platform.graph_api(device)``.

    Attributes:
        plan: ``"eager"``, ``"static"``, ``"graphs"`` or ``"compile"``.
        enabled: Whether pure-decode steps take the static path.
        failure: Why the static path was turned off, or None.
        graphs: The captured graphs (``"graphs"`` plan).
        bucket_to_fn: The compiled callable of each bucket (``"compile"`` plan).
    """

    def __init__(self, static: StaticDecodeStep | None, *, device: torch.device,
                 mode: bool | str = "auto",
                 compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
                 graph_api: GraphAPI | None = None) -> None:
        self.static = static
        self.device = device
        plan = resolve_plan(mode, device)
        if mode is not False and compile_fn is not None:
            plan = "compile"
        elif mode is not False and graph_api is not None:
            plan = "graphs"
        self.plan = plan if static is not None else "eager"
        self.enabled = self.plan != "eager"
        self.compile_fn = compile_fn or self._torch_compile
        self.bucket_to_fn: dict[Bucket, Callable[..., Any]] = {}
        self.failure: str | None = None
        self.graphs: DecodeGraphs | None = None
        if self.plan == "graphs":
            from langchain_ascend.engine.worker.graphs import DecodeGraphs

            api = graph_api or platform.graph_api(device)
            assert static is not None and api is not None
            self.graphs = DecodeGraphs(static, api)

    def _torch_compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        backend = platform.compile_backend(self.device) or "inductor"
        return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)

    def run(self, layout: BatchLayout, input_ids: list[int], positions: list[int],
            sample_rows: list[int]) -> torch.Tensor | None:
        """``(S, V)`` logits of ``sample_rows`` from the static path, or None when the step
        must run eagerly (not a pure decode, no bucket fits, or the path is off)."""
        if not self.enabled:
            return None
        assert self.static is not None
        key = self.static.bucket(layout)
        if key is None:
            return None
        if self.graphs is not None and not self.graphs.captured:
            self.graphs.capture_all()  # no warmup() before the first decode: capture now
        self.static.stage(key, layout, input_ids, positions)
        try:
            logits = self._run_bucket(key)  # (B, V)
        except Exception as exc:  # noqa: BLE001 - any compile problem means: run eagerly
            self.enabled = False
            self.failure = f"{type(exc).__name__}: {exc}"
            logger.warning("static decode step failed, running eagerly from now on: %s",
                           self.failure)
            return None
        if sample_rows == list(range(len(sample_rows))):
            return logits[: len(sample_rows)]  # (S, V)
        import torch

        return logits[torch.tensor(sample_rows, device=logits.device)]  # (S, V)

    def _run_bucket(self, key: Bucket) -> torch.Tensor:
        assert self.static is not None
        if self.graphs is not None:
            out = self.graphs.replay(key)
            if out is not None:
                return out
            return self.static.run(key)
        if self.plan == "compile":
            fn = self.bucket_to_fn.get(key)
            if fn is None:
                fn = self.compile_fn(self.static.step_fn)
                self.bucket_to_fn[key] = fn
            return fn(*self.static.views(key))
        return self.static.run(key)

    def warmup(self) -> None:
        """Capture every bucket (graphs) or compile the smallest one (compile)."""
        if not self.enabled or self.static is None:
            return
        if self.graphs is not None:
            self.graphs.capture_all()
        elif self.plan == "compile":
            key = (self.static.batch_sizes[0], self.static.widths[0])
            self.static.stage(key)
            try:
                self._run_bucket(key)
            except Exception as exc:  # noqa: BLE001
                self.enabled = False
                self.failure = f"{type(exc).__name__}: {exc}"
                logger.warning("compiling the static decode step failed, running eagerly: %s",
                               self.failure)

