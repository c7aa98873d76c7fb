"""How pure-decode steps run: eagerly, as the static step, captured, or compiled.

Prefill and mixed steps run the runner's eager packed forward; pure decodes run the static
step (``engine.worker.static_step``) as ``compile=`` plans: captured graphs on CUDA/NPU,
``torch.compile`` on the CPU (``True``: every bucket; ``"auto"``: one bucket, kept at
:meth:`StepCompiler.warmup` only where it measured faster, see ``compile_choice``).
Invariant: a bucket's first compiled run is checked against the eager static step over the
same inputs, and differing greedy tokens (:class:`ParityError`) count as a compile failure,
so a miscompiled step never changes a reply. Any failure while compiling or running turns the
static path off and reruns the step eagerly: its K/V writes repeat with the same values.
The mode table, the "auto" measurement and its numbers: docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
from langchain_ascend.engine.worker import compile_choice
from langchain_ascend.engine.worker.compile_choice import CompileChoice
from langchain_ascend.engine.worker.graphs import DecodeGraphs

if TYPE_CHECKING:
    import torch

    from langchain_ascend.attention.backends.base import BatchLayout
    from langchain_ascend.engine.worker.static_step import Bucket, StaticDecodeStep
    from langchain_ascend.platform import GraphAPI

logger = logging.getLogger(__name__)

MODES = ("auto", True, False, "static")
PROBE_REPEATS = 7
"""Eager and compiled steps timed at ``"auto"``'s warm-up, alternating (median of each)."""
PRODUCTS_PASSES = 3
"""Passes of :func:`torch_products_ms` (the fastest counts)."""


class ParityError(RuntimeError):
    """A compiled step's greedy tokens differ from the eager static step's."""


@dataclass(frozen=True)
class DecodeProbe:
    """A one-row decode on the scratch block that ``"auto"``'s warm-up measures (built by the
    runner, which knows how to run a whole step).

    Attributes:
        bucket: The static-step bucket the decode runs at.
        tokens: Distinct input tokens, one per repeat.
        step: Runs the decode of one input token through the runner's whole step
            (``execute``: the static path or the eager one, as the compiler's state says)
            and returns the greedy token. Writes only the scratch block.
        model_key: The model's fingerprint (``compile_choice.model_fingerprint``).
        products_ms: Measures torch's products alone at the bucket's rows, in ms
            (:func:`products_timer`); None: not measured, always compile.
    """

    bucket: Bucket
    tokens: tuple[int, ...]
    step: Callable[[int], int]
    model_key: str
    products_ms: Callable[[], float] | None = None


@dataclass(frozen=True)
class _Measurement:
    """Medians of the timed steps, the compile's seconds, and what went wrong (None: no
    failure, every greedy token agreed)."""

    eager_ms: float | None
    compiled_ms: float | None
    compile_s: float | None
    problem: str | None
    products_ms: float | None = None


def torch_products_ms(model: Any, rows: int, passes: int = PRODUCTS_PASSES) -> float:
    """Milliseconds of one pass of ``torch.nn.functional.linear`` over every ``nn.Linear`` of
    ``model`` (its own ``weight`` and ``bias``, LM head included) on a ``(rows, in)`` input,
    the fastest of ``passes``: the products a compiled CPU step still runs through torch.

    One input per width is allocated before timing; modules sharing a weight count once each
    (as the forward runs them).
    """
    import torch
    import torch.nn.functional as F

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        return 0.0
    device = linears[0].weight.device
    best = float("inf")
    with torch.inference_mode():
        inputs: dict[tuple[Any, ...], torch.Tensor] = {}
        pairs = []
        for m in linears:
            key = (m.in_features, m.weight.dtype, m.weight.device)
            if key not in inputs:
                inputs[key] = torch.randn(rows, m.in_features, device=m.weight.device
                                          ).to(m.weight.dtype)  # (rows, in)
            pairs.append((inputs[key], m.weight, m.bias))
        for _ in range(max(1, passes)):
            platform.synchronize(device)
            start = time.perf_counter()
            for x, weight, bias in pairs:
                F.linear(x, weight, bias)  # (rows, out)
            platform.synchronize(device)
            best = min(best, time.perf_counter() - start)
    return best * 1e3


def products_timer(model: Any, rows: int) -> Callable[[], float]:
    """:func:`torch_products_ms` of ``model`` at ``rows``, measured when called (the probe's
    ``products_ms``)."""
    return lambda: torch_products_ms(model, rows)


def resolve_plan(mode: bool | str, device: torch.device) -> str:
    """What runs pure-decode steps for ``mode`` on ``device``: ``"eager"``, ``"static"``,
    ``"graphs"``, ``"compile"`` or ``"measure"`` (compiled or eager as ``warmup()`` decides;
    module docstring).

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
        if platform.compile_backend(device) is None:
            return "eager"
        if mode is True:
            return "compile"
        return "measure" if platform.device_type(device) == "cpu" else "eager"
    raise ValueError(f"compile must be 'auto', 'static', True or False, got {mode!r}")


def resolve_compile(mode: bool | str, device: torch.device) -> bool:
    """Whether ``mode`` always captures or compiles the decode step on ``device`` (False for
    ``"measure"``, which decides at warm-up).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    return resolve_plan(mode, device) in ("graphs", "compile")


def _plan_for(mode: bool | str, device: torch.device, compile_fn: Any, graph_api: Any) -> str:
    """:func:`resolve_plan`, where an injected ``compile_fn`` implies a compiled plan
    (``"measure"`` for ``"auto"`` on the CPU) and an injected ``graph_api`` implies graphs."""
    plan = resolve_plan(mode, device)
    if mode is False:
        return plan
    if compile_fn is not None:
        cpu_auto = mode == "auto" and platform.device_type(device) == "cpu"
        return "measure" if cpu_auto else "compile"
    return "graphs" if graph_api is not None else plan


def _timed(step: Callable[[int], int], token: int) -> tuple[int, float]:
    """``(step(token), seconds it took)``."""
    start = time.perf_counter()
    out = step(token)
    return out, time.perf_counter() - start


def _median_ms(seconds: list[float]) -> float | None:
    return statistics.median(seconds) * 1e3 if seconds else None


class StepCompiler:
    """Runs pure-decode steps through the static step, captured or compiled as planned.

    Args:
        static: The runner's static step (None: every step is eager).
        device: Where the model runs.
        mode: See :data:`MODES`.
        compile_fn: Turns the static step function into its compiled form (implies the
            ``"compile"`` plan, or ``"measure"`` for ``"auto"`` on the CPU, unless ``mode`` is
            False); default ``torch.compile(fn, backend=platform.compile_backend(device),
            fullgraph=True, dynamic=False)``.
        graph_api: The graph API to capture with (implies the ``"graphs"`` plan unless
            ``mode`` is False); default ``platform.graph_api(device)``.

    Attributes:
        plan: ``"eager"``, ``"static"``, ``"graphs"``, ``"compile"`` or ``"measure"`` (until
            :meth:`warmup` makes it ``"compile"`` or ``"eager"``).
        enabled: Whether pure-decode steps take the static path.
        compiles_on_demand: Whether a bucket without a compiled callable is compiled at its
            first step (True for ``compile=True``; ``"auto"`` runs such buckets eagerly).
        failure: Why the static path was turned off, or None.
        choice: What ``"auto"``'s warm-up chose, or None (not decided).
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
        self.enabled = self.plan not in ("eager", "measure")
        self.compiles_on_demand = self.plan == "compile"
        self.compile_fn = compile_fn or self._torch_compile
        self.bucket_to_fn: dict[Bucket, Callable[..., Any]] = {}
        self.failure: str | None = None
        self.choice: CompileChoice | None = None
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
        """What runs pure-decode steps, for stats and logs: the plan, the compiled buckets,
        the failure and ``"auto"``'s choice."""
        return {"plan": self.plan, "compiled_buckets": sorted(self.bucket_to_fn),
                "failure": self.failure,
                "choice": None if self.choice is None else self.choice.as_dict()}

    def bucket_for(self, layout: BatchLayout) -> Bucket | None:
        """The bucket the static path runs ``layout`` at, or None where the step runs eagerly:
        not a pure decode, no bucket fits, the path is off, or ``"auto"`` compiled another
        bucket."""
        if not self.enabled:
            return None
        assert self.static is not None
        key = self.static.bucket(layout)
        if key is None or (self.plan == "compile" and not self.compiles_on_demand
                           and key not in self.bucket_to_fn):
            return None
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

    def warmup(self, probe: DecodeProbe | None = None) -> None:
        """Capture every bucket (graphs); compile the probe's bucket, or without a probe the
        smallest one (compile); measure and choose (``"measure"``, needs the probe; module
        docstring)."""
        if self.static is None:
            return
        if self.plan == "measure":
            if probe is not None:
                self._choose(probe)
            return
        if not self.enabled:
            return
        if self.graphs is not None:
            self.graphs.capture_all()
        elif self.plan == "compile" and probe is not None:
            probe.step(probe.tokens[0])  # compiles the bucket on its way through run()
        elif self.plan == "compile":
            key = (self.static.batch_sizes[0], self.static.widths[0])
            self.static.stage(key)
            try:
                self._run_bucket(key, key[0])
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, "compiling the static decode step failed, running eagerly")

    def _choose(self, probe: DecodeProbe) -> None:
        """Decide ``"measure"``: from the cache, or by measuring; then settle the plan."""
        key = compile_choice.choice_key(probe.model_key, probe.bucket, self._backend())
        cached = compile_choice.load_choice(key)
        budget_s = compile_choice.compile_budget_s()
        if cached is not None and cached.chosen == "eager":
            choice = cached
        elif budget_s == 0:
            choice = CompileChoice("eager", f"not measured: {compile_choice.BUDGET_ENV_VAR}=0",
                                   probe.bucket)
        else:
            found = self._measure(probe, precheck=cached is None)
            if isinstance(found, CompileChoice):
                choice = found  # the compiled step cannot win: nothing was compiled
                compile_choice.store_choice(key, choice)
            elif cached is not None and found.problem is None:
                choice = cached  # compiled before on this machine, and greedy parity holds
            else:
                choice = compile_choice.decide(
                    probe.bucket, eager_ms=found.eager_ms, compiled_ms=found.compiled_ms,
                    compile_s=found.compile_s, problem=found.problem, budget_s=budget_s)
                choice = dataclasses.replace(choice, products_ms=found.products_ms)
                compile_choice.store_choice(key, choice)
        self._settle(choice)

    def _measure(self, probe: DecodeProbe, *, precheck: bool = True,
                 ) -> _Measurement | CompileChoice:
        """Time the eager step over ``probe.tokens`` and (``precheck``) torch's products; the
        eager choice where the compiled step cannot win (``compile_choice.skip_reason``).
        Otherwise compile ``probe.bucket`` on its first compiled step, then time the eager and
        the compiled step alternately over ``probe.tokens``, comparing their greedy tokens."""
        products_ms = None
        if precheck and probe.products_ms is not None:
            self.enabled = False
            eager_ms = _median_ms([_timed(probe.step, token)[1] for token in probe.tokens])
            assert eager_ms is not None
            products_ms = probe.products_ms()
            reason = compile_choice.skip_reason(eager_ms, products_ms)
            if reason is not None:
                return CompileChoice("eager", reason, probe.bucket, eager_ms=eager_ms,
                                     products_ms=products_ms)
        self.plan, self.enabled, self.compiles_on_demand = "compile", True, True
        _, compile_s = _timed(probe.step, probe.tokens[0])
        self.compiles_on_demand = False
        eager_s: list[float] = []
        compiled_s: list[float] = []
        problem = self.failure
        for token in probe.tokens if problem is None else ():
            self.enabled = False
            eager_token, seconds = _timed(probe.step, token)
            eager_s.append(seconds)
            self.enabled = True
            compiled_token, seconds = _timed(probe.step, token)
            problem = self.failure
            if problem is not None:
                break
            compiled_s.append(seconds)
            if compiled_token != eager_token:
                problem = (f"greedy parity: input token {token} gave {compiled_token} compiled, "
                           f"{eager_token} eager")
                break
        return _Measurement(_median_ms(eager_s), _median_ms(compiled_s), compile_s, problem,
                            products_ms)

    def _settle(self, choice: CompileChoice) -> None:
        """Make ``choice`` the plan: the compiled bucket (``"compile"``, no compiles on
        demand) or ``"eager"``; record and log it."""
        self.choice = choice
        if choice.chosen == "compiled":
            self.plan, self.enabled, self.compiles_on_demand = "compile", True, False
        else:
            self.plan, self.enabled = "eager", False
            self.bucket_to_fn.clear()
        logger.info("compile='auto': %s", choice.summary())
