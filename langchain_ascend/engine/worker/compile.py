"""How pure-decode steps run: eagerly, as the static step, captured, or compiled.

Prefill and mixed steps run the runner's eager packed forward; pure decodes run the static
step (``engine.worker.static_step``) as ``compile=`` plans: ``"auto"`` captures graphs on
CUDA/NPU and runs eager elsewhere (on the CPU the owned model's native decode stack is the fast
decode step); ``True`` captures, or ``torch.compile``s every bucket where there is no graph API.
Invariant: a bucket's first compiled run is checked against the eager static step over the
same inputs, and differing greedy tokens (:class:`ParityError`) count as a compile failure,
so a miscompiled step never changes a reply. Any failure while compiling or running turns the
static path off and reruns the step eagerly: its K/V writes repeat with the same values.
The mode table: docs/performance.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
from langchain_ascend.engine.worker.graphs import DecodeGraphs

if TYPE_CHECKING:
    import torch

    from langchain_ascend.attention.backends.base import BatchLayout
    from langchain_ascend.engine.worker.static_step import Bucket, StaticDecodeStep
    from langchain_ascend.platform import GraphAPI

logger = logging.getLogger(__name__)

MODES = ("auto", True, False, "static")


class ParityError(RuntimeError):
    """A compiled step's greedy tokens differ from the eager static step's."""


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


def _plan_for(mode: bool | str, device: torch.device, compile_fn: Any, graph_api: Any) -> str:
    """:func:`resolve_plan`, where an injected ``compile_fn`` implies the compiled plan for
    ``True`` and an injected ``graph_api`` implies graphs."""
    plan = resolve_plan(mode, device)
    if mode is False:
        return plan
    if compile_fn is not None and mode is True:
        return "compile"
    return "graphs" if graph_api is not None else plan


class StepCompiler:
    """Runs pure-decode steps through the static step, captured or compiled as planned.

    Args:
        static: The runner's static step (None: every step is eager).
        device: Where the model runs.
        mode: See :data:`MODES`.
        compile_fn: Turns the static step function into its compiled form (implies the
            ``"compile"`` plan for ``mode=True``); default ``torch.compile(fn, backend=platform.compile_backend(device),
            fullgraph=True, dynamic=False)``.
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
        plan = _plan_for(mode, device, compile_fn, graph_api)
        self.plan = plan if static is not None else "eager"
        self.enabled = self.plan != "eager"
        self.compile_fn = compile_fn or self._torch_compile
        self.bucket_to_fn: dict[Bucket, Callable[..., Any]] = {}
        self.failure: str | None = None
        self.graphs: DecodeGraphs | None = None
        if self.plan == "graphs":
            api = graph_api or platform.graph_api(device)
            assert static is not None and api is not None
            self.graphs = DecodeGraphs(static, api)

    def _torch_compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        return torch.compile(fn, backend=self._backend(), fullgraph=True, dynamic=False)

    def _backend(self) -> str:
        return platform.compile_backend(self.device) or "inductor"

    def describe(self) -> dict[str, Any]:
        """What runs pure-decode steps, for stats and logs: the plan, the compiled buckets and
        the failure."""
        return {"plan": self.plan, "compiled_buckets": sorted(self.bucket_to_fn),
                "failure": self.failure}

    def bucket_for(self, layout: BatchLayout) -> Bucket | None:
        """The bucket the static path runs ``layout`` at, or None where the step runs eagerly:
        not a pure decode, no bucket fits or the path is off."""
        if not self.enabled:
            return None
        assert self.static is not None
        key = self.static.bucket(layout)
        return key

    def run(self, layout: BatchLayout, input_ids: list[int], positions: list[int],
            sample_rows: list[int]) -> torch.Tensor | None:
        """``(S, V)`` logits of ``sample_rows`` from the static path, or None when the step
        must run eagerly (:meth:`bucket_for`, or the static path just failed)."""
        key = self.bucket_for(layout)
        if key is None:
            return None
        assert self.static is not None
        if self.graphs is not None and not self.graphs.captured:
            self.graphs.capture_all()  # no warmup() before the first decode: capture now
        self.static.stage(key, layout, input_ids, positions)
        try:
            logits = self._run_bucket(key, layout.num_segments)  # (B, V)
        except Exception as exc:  # noqa: BLE001 - any compile problem means: run eagerly
            self._fail(exc, "static decode step failed, running eagerly from now on")
            return None
        if sample_rows == list(range(len(sample_rows))):
            return logits[: len(sample_rows)]  # (S, V)
        import torch

        return logits[torch.tensor(sample_rows, device=logits.device)]  # (S, V)

    def _fail(self, exc: Exception, what: str) -> None:
        self.enabled = False
        self.failure = f"{type(exc).__name__}: {exc}"
        logger.warning("%s: %s", what, self.failure)

    def _run_bucket(self, key: Bucket, rows: int) -> torch.Tensor:
        """``(B, V)`` logits of the staged bucket ``key`` whose first ``rows`` rows are real."""
        assert self.static is not None
        if self.graphs is not None:
            out = self.graphs.replay(key)
            if out is not None:
                return out
            return self.static.run(key)
        if self.plan == "compile":
            fn = self.bucket_to_fn.get(key)
            if fn is None:
                return self._compile_bucket(key, rows)
            return fn(*self.static.views(key))
        return self.static.run(key)

    def _compile_bucket(self, key: Bucket, rows: int) -> torch.Tensor:
        """Compile bucket ``key``, run it over the staged inputs and keep it when the greedy
        tokens of its first ``rows`` rows equal the eager static step's.

        Raises:
            ParityError: They differ.
        """
        import torch

        assert self.static is not None
        fn = self.compile_fn(self.static.step_fn)
        logits = fn(*self.static.views(key))  # (B, V); a torch.compile'd fn compiles here
        got = logits[:rows].argmax(dim=-1)  # (rows,)
        want = self.static.run(key)[:rows].argmax(dim=-1)  # (rows,) same staged inputs
        if not torch.equal(got, want):
            raise ParityError(f"bucket {key}: greedy parity: compiled tokens {got.tolist()} "
                              f"!= eager {want.tolist()}")
        self.bucket_to_fn[key] = fn
        return logits

    def warmup(self) -> None:
        """Capture every bucket (graphs), or compile the smallest one (compile)."""
        if self.static is None or not self.enabled:
            return
        if self.graphs is not None:
            self.graphs.capture_all()
        elif self.plan == "compile":
            key = (self.static.batch_sizes[0], self.static.widths[0])
            self.static.stage(key)
            try:
                self._run_bucket(key, key[0])
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, "compiling the static decode step failed, running eagerly")
