"""``NPUStreamToolExecutor``: run an agent hop's tool calls in parallel, each on its own device
stream, with timeouts, retries and ToolNode-compatible inputs and outputs.

torch is not imported here: the device is resolved on first use (and not at all for
``device="cpu"`` / ``None``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
    patch_config,
    set_config_context,
)
from langchain_core.runnables.utils import coro_with_context
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from pydantic import ValidationError

from langchain_ascend import platform
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError, ToolCallError
from langchain_ascend.executor import calls as calls_mod
from langchain_ascend.executor import injection
from langchain_ascend.executor.call_types import CallSpec, Limits, Plan, RetryPolicy, clock
from langchain_ascend.executor.calls import PreparedCall
from langchain_ascend.executor.error_policy import error_policy
from langchain_ascend.executor.runtime import run_async, run_sync
from langchain_ascend.executor.session_hub import HUB, session_of
from langchain_ascend.executor.tool_messages import finish
from langchain_ascend.executor.workers import CallerStreams, WorkerPool
from langchain_ascend.validation import check_count, check_flag, check_int, check_number

#: Calls run at once when neither ``max_concurrency`` nor the RunnableConfig sets a limit.
DEFAULT_MAX_PARALLEL = 64

_UNRESOLVED = object()


class NPUStreamToolExecutor(Runnable[Any, Any]):
    """Run the tool calls of an ``AIMessage`` concurrently and return ``ToolMessage``\\ s in
    call order: a drop-in for langgraph's ``ToolNode`` with timeouts, retries, a real
    concurrency bound and one device stream per call.

    Inputs and outputs are ToolNode's: an ``AIMessage``, a list of messages (its last
    ``AIMessage``) or a list of ToolCall dicts give a list of ``ToolMessage``; a state dict
    ``{"messages": [...]}`` (or an object with ``.messages``) gives ``{"messages": [...]}``. No
    tool calls give ``[]`` / ``{"messages": []}``. A tool returning a langgraph ``Command``
    makes the output a list of updates and commands, as ToolNode does.

    Concurrency: sync tools run on the executor's own daemon threads (as many as calls in
    flight, not as many as cores), async tools on the event loop; at most ``max_concurrency``
    (or the RunnableConfig's ``max_concurrency``, whichever is smaller) run at once, in both
    ``invoke`` and ``ainvoke``.

    Timeouts: each attempt has ``timeout_ms``. A late call is answered on time with
    ``ToolMessage(status="error")``. An async tool is cancelled. A sync tool cannot be killed:
    its thread is abandoned (it finishes on its own and its result is dropped); at most
    ``max_abandoned_threads`` may be stuck at once, and the bound holds even when every
    call in flight hangs: it is also the most sync attempts busy at once (running or stuck),
    so a further sync call waits for a slot, and once every slot is held by a stuck thread new
    sync calls fail fast with ``ToolWorkersExhaustedError`` (as an error ``ToolMessage`` under
    the default ``handle_tool_errors``) until some return; async tools keep running.

    Retries: an error that is an instance of ``retry_on`` (or for which a ``retry_on``
    predicate returns True) is retried up to ``retry_times`` times with exponential backoff
    and jitter starting at ``retry_backoff_ms``. Timeouts are retried only with
    ``retry_on_timeout=True``. Malformed calls and argument validation errors are never
    retried.

    Errors (``handle_tool_errors``, read as ToolNode reads it): ``True`` turns unknown tools,
    invalid arguments, timeouts and tool exceptions into error ``ToolMessage``\\ s whose text
    tells the model what to fix; a ``str`` replaces that text; an exception type or tuple
    limits which errors are caught; a callable ``handler(e) -> str`` is called for the
    exception types its first parameter is annotated with; ``False`` lets exceptions
    propagate (malformed calls raise :class:`~langchain_ascend.errors.ToolCallError`, timeouts
    :class:`~langchain_ascend.errors.ToolTimeoutError`). langgraph interrupts always propagate.

    Input checks: a ``tool_call_id`` used twice runs once, later calls with it get an error
    message; a missing id becomes ``"<name>-<index>"``; arguments given as a JSON string are
    decoded, arguments that are not an object are an error. ``AIMessage.invalid_tool_calls``
    are ignored (as by ToolNode). Non-string tool results are sent as JSON, or ``str()`` when
    not JSON-serialisable; ``response_format="content_and_artifact"`` artifacts are kept.

    Injection: ``InjectedToolCallId``; with langgraph, ``InjectedState`` / ``InjectedState
    ("field")`` (from the input state or message list), ``InjectedStore`` and ``ToolRuntime``
    (from the graph the executor runs in). Values a model sends for injected arguments are
    dropped.

    Device streams: with ``device`` an accelerator (``"auto"`` picks NPU, then CUDA, once
    torch has been imported by a model or tool; the executor never imports torch just to
    look), each sync attempt runs with a side stream from a per-device pool current; the
    caller's stream waits on an event recorded after the tool, and result tensors are
    ``record_stream``-ed, so outputs are safe to use on the caller's stream without a global
    synchronize. Native async tools share the caller's stream (coroutines on one loop share a
    thread, and the current stream is per thread). On CPU nothing of this happens.

    Timings: every ``ToolMessage.response_metadata["tool_timing"]`` holds ``queue_ms``,
    ``run_ms``, ``retry_wait_ms``, ``total_ms``, ``start_ms``/``end_ms`` (relative to the
    executor's start), ``attempts``, ``retries``, ``attempt_ms``, ``timed_out``, ``mode``
    (``"thread"`` / ``"async"``) and ``stream`` (None on CPU).

    Agent sessions: when the run's config names a session (``metadata["ascend_session_id"]``,
    set by ``create_ascend_agent``, or langgraph's ``thread_id``; see
    ``executor.session_hub``), each call is handed to the engine that parked that session as it
    finishes: its latency feeds the engine's per-tool TTL estimate and its ``ToolMessage`` is
    prefilled in the background while the sibling calls still run.

    Tracing: the executor is one chain run and every tool run is its child; as a langgraph
    node the node's run plays that part (as with ToolNode), without an extra level.

    Args:
        tools: Tools, or plain functions (turned into tools with ``@tool``).
        timeout_ms: Deadline of each attempt in milliseconds; None for none.
        retry_times: Retries after the first attempt.
        retry_on: Exception types worth retrying, or a predicate on the exception.
        retry_on_timeout: Retry attempts that timed out too.
        retry_backoff_ms: Delay before the first retry (doubles each time, jittered).
        max_concurrency: Most calls running at once (None: all calls, up to
            ``DEFAULT_MAX_PARALLEL``).
        handle_tool_errors: See "Errors" above.
        device: ``"auto"``, ``"npu"``, ``"npu:1"``, ``"cuda"``, ``"cpu"`` or None (no
            streams; torch is never imported).
        enable_parallel: False runs the calls one after another, in order (timeouts and
            retries still apply).
        max_abandoned_threads: Most threads that may be stuck in timed-out sync calls (>= 1),
            hence also the most sync attempts busy at once.
        messages_key: State field with the messages.
        name: Run name in traces.

    Example:
        .. code-block:: python

            from langchain_core.messages import AIMessage
            from langchain_core.tools import tool
            from langchain_ascend import NPUStreamToolExecutor

            @tool
            def add(a: int, b: int) -> int:
                \"\"\"Add two integers.\"\"\"
                return a + b

            executor = NPUStreamToolExecutor([add], timeout_ms=2000)
            call = {"name": "add", "args": {"a": 1, "b": 2}, "id": "c1", "type": "tool_call"}
            executor.invoke(AIMessage("", tool_calls=[call]))[0].content
            # -> '3'

        In a graph: ``graph.add_node("tools", executor)`` with
        ``add_conditional_edges("agent", tools_condition)``; in LCEL:
        ``prompt | model.bind_tools([add]) | executor``.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        timeout_ms: float | None = 15000,
        retry_times: int = 2,
        retry_on: tuple[type[BaseException], ...] | type[BaseException]
        | Callable[[BaseException], bool] = (ConnectionError, TimeoutError),
        retry_on_timeout: bool = False,
        retry_backoff_ms: float = 100.0,
        max_concurrency: int | None = None,
        handle_tool_errors: Any = True,
        device: Any = "auto",
        enable_parallel: bool = True,
        max_abandoned_threads: int = DEFAULT_MAX_PARALLEL,
        messages_key: str = "messages",
        name: str = "tools",
    ) -> None:
        self.name = name
        self.tools_by_name: dict[str, BaseTool] = {}
        for item in _tool_items(tools):
            tool = item if isinstance(item, BaseTool) else as_tool(item)
            if tool.name in self.tools_by_name:
                raise InvalidRequestError(f"two tools are named {tool.name!r}; names must differ")
            self.tools_by_name[tool.name] = tool
        check_number("timeout_ms", timeout_ms, minimum=0, open_min=True, allow_none=True)
        check_int("retry_times", retry_times, minimum=0)
        check_number("retry_backoff_ms", retry_backoff_ms, minimum=0)
        check_count("max_concurrency", max_concurrency, allow_none=True)
        check_count("max_abandoned_threads", max_abandoned_threads)
        check_flag("enable_parallel", enable_parallel)
        check_flag("retry_on_timeout", retry_on_timeout)
        self.timeout_ms = timeout_ms
        self.max_concurrency = max_concurrency
        self.enable_parallel = enable_parallel
        self.messages_key = messages_key
        self.handle_tool_errors = handle_tool_errors
        self._policy = error_policy(handle_tool_errors)
        self._retry = RetryPolicy(
            times=retry_times, retry_on=_retry_matcher(retry_on), on_timeout=retry_on_timeout,
            never=(ToolCallError,), backoff_s=retry_backoff_ms / 1e3)
        self._specs = {n: injection.injection_spec(t) for n, t in self.tools_by_name.items()}
        self._titles = {n: injection.schema_title(t) for n, t in self.tools_by_name.items()}
        self._sync_body = {n: injection.has_sync_body(t) for n, t in self.tools_by_name.items()}
        self._async_body = {n: injection.has_async_body(t) for n, t in self.tools_by_name.items()}
        self._pool = WorkerPool(max_abandoned=max_abandoned_threads)
        self._device_request = device
        self._device: Any = _UNRESOLVED
        if device is not None and str(device).lower() not in ("auto", "cpu"):
            self._resolve_device()

    def __repr__(self) -> str:
        return (f"NPUStreamToolExecutor(tools={list(self.tools_by_name)}, "
                f"timeout_ms={self.timeout_ms}, max_concurrency={self.max_concurrency}, "
                f"device={self._device_request!r})")

    @property
    def device(self) -> str:
        """The device whose streams the calls use (``"cpu"`` when none)."""
        device = self._resolve_device()
        return "cpu" if device is None else str(device)

    def thread_stats(self) -> Any:
        """Live / idle / abandoned worker threads (a ``PoolStats``)."""
        return self._pool.stats()

    # ------------------------------------------------------------------ Runnable

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Run every tool call of ``input``; see the class docstring for shapes.

        Traced as one chain run with each tool run as its child. As a langgraph node, the
        node's own run is that run (as with ToolNode), so no extra level is added.
        """
        config = ensure_config(config)
        if _is_graph_node(config):
            return self._run(input, _for_tools(config))
        run_manager = get_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None))
        try:
            child_config = patch_config(config, callbacks=run_manager.get_child())
            with set_config_context(child_config) as context:
                output = context.run(self._run, input, child_config)
        except BaseException as exc:
            run_manager.on_chain_error(exc)
            raise
        run_manager.on_chain_end(output)
        return output

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None,
                      **kwargs: Any) -> Any:
        """Async :meth:`invoke`: async tools run on the loop, sync tools on the threads."""
        config = ensure_config(config)
        if _is_graph_node(config):
            return await self._arun(input, _for_tools(config))
        run_manager = await get_async_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None))
        try:
            child_config = patch_config(config, callbacks=run_manager.get_child())
            with set_config_context(child_config) as context:
                output = await coro_with_context(self._arun(input, child_config), context)
        except BaseException as exc:
            await run_manager.on_chain_error(exc)
            raise
        await run_manager.on_chain_end(output)
        return output

    def _run(self, input: Any, config: RunnableConfig) -> Any:
        plan = self._plan(input, config, use_async=False)
        records = run_sync(plan.specs, plan.limits, self._pool) if plan.specs else []
        return finish(plan, records, self._policy, self.messages_key)

    async def _arun(self, input: Any, config: RunnableConfig) -> Any:
        plan = self._plan(input, config, use_async=True)
        records = await run_async(plan.specs, plan.limits, self._pool) if plan.specs else []
        return finish(plan, records, self._policy, self.messages_key)

    # ------------------------------------------------------------------ planning

    def _plan(self, input: Any, child_config: RunnableConfig, use_async: bool) -> Plan:
        """Check and inject every call, build its attempt body; ``child_config`` carries the
        executor run's callbacks, so tool runs become its children."""
        parsed = calls_mod.parse_input(input, self.messages_key)
        prepared = calls_mod.prepare_calls(parsed.calls, self.tools_by_name)
        context = _GraphContext.capture() if any(
            c.problem is None and self._specs[c.name].needs_context for c in prepared) else None
        runnable: list[PreparedCall] = []
        for call in prepared:
            if call.problem is None:
                try:
                    call.args = self._inject(call, parsed, context, child_config)
                except ToolCallError as exc:
                    call.problem = exc
            if call.problem is not None:
                if not self._policy.handles(call.problem):
                    raise call.problem
                continue
            runnable.append(call)
        device = self._resolve_device() if runnable else None
        streams = CallerStreams(device) if device is not None else None
        specs = [self._spec(call, child_config, streams, use_async) for call in runnable]
        limit = min(len(runnable) or 1, self.max_concurrency or DEFAULT_MAX_PARALLEL)
        config_limit = check_count("the RunnableConfig's max_concurrency",
                                   child_config.get("max_concurrency"), allow_none=True)
        if config_limit is not None:
            limit = min(limit, int(config_limit))
        if not self.enable_parallel:
            limit = 1
        limits = Limits(
            concurrency=limit,
            timeout_s=None if self.timeout_ms is None else self.timeout_ms / 1e3,
            retry=self._retry,
            propagate=lambda exc: not self._policy.handles(exc),
        )
        return Plan(parsed.kind, prepared, runnable, specs, limits, streams, use_async)

    def _inject(self, call: PreparedCall, parsed: Any, context: _GraphContext | None,
                config: RunnableConfig) -> dict[str, Any]:
        spec = self._specs[call.name]
        if spec is injection.NO_INJECTION:
            return call.args  # type: ignore[return-value]
        runtime_factory = None
        if spec.runtime:
            def runtime_factory() -> Any:
                return context.tool_runtime(  # type: ignore[union-attr]
                    parsed.state, call.id, config, list(self.tools_by_name.values()))
        return injection.inject_args(
            call.args or {}, spec, tool_name=call.name, state=parsed.state,
            messages_key=self.messages_key, store=context.store if context else None,
            runtime_factory=runtime_factory)

    def _spec(self, call: PreparedCall, config: RunnableConfig, streams: CallerStreams | None,
              use_async: bool) -> CallSpec:
        tool = call.tool
        assert tool is not None
        tool_call = {"name": call.name, "args": call.args, "id": call.id, "type": "tool_call"}
        title = self._titles[call.name]
        hidden = self._specs[call.name].hidden

        def invalid_args(exc: ValidationError) -> ToolCallError:
            detail = injection.describe_validation_error(exc, hidden)
            return ToolCallError(f"invalid arguments for tool {call.name!r}: {detail}")

        session = session_of(config)

        def report(result: Any, start: float) -> None:
            """Hand the finished call to the engine that parked the session, if any."""
            HUB.tool_finished(session, call.id or "", call.name, result, clock() - start)

        if use_async and self._async_body[call.name]:
            async def run_async_body() -> Any:
                start = clock()
                try:
                    result = await tool.ainvoke(tool_call, config)
                except ValidationError as exc:
                    report(None, start)
                    if exc.title != title:
                        raise
                    raise invalid_args(exc) from exc
                except BaseException:
                    report(None, start)
                    raise
                report(result, start)
                return result

            return CallSpec(call.name, None, run_async_body)

        if self._sync_body[call.name]:
            def body() -> Any:
                return tool.invoke(tool_call, config)
        else:
            def body() -> Any:
                return asyncio.run(tool.ainvoke(tool_call, config))

        def run_body() -> Any:
            start = clock()
            try:
                result = body()
            except ValidationError as exc:
                report(None, start)
                if exc.title != title:
                    raise
                raise invalid_args(exc) from exc
            except BaseException:
                report(None, start)
                raise
            report(result, start)
            return result

        if streams is None:
            return CallSpec(call.name, run_body)
        return CallSpec(call.name, lambda: streams.run(run_body))

    def _resolve_device(self) -> Any:
        """The accelerator to use, or None.

        ``"auto"`` is resolved once torch has been imported by someone (a model, a tool):
        before that no device work can be queued, and importing torch just to find out would
        cost seconds on the first call of a pure-I/O agent.
        """
        if self._device is _UNRESOLVED:
            request = self._device_request
            if request is None or str(request).lower() == "cpu":
                self._device = None
            elif str(request).lower() == "auto" and "torch" not in sys.modules:
                return None
            else:
                resolved = platform.resolve_device(request)
                self._device = None if resolved.type == "cpu" else resolved
        return self._device

# ---------------------------------------------------------------------- helpers


@dataclasses.dataclass
class _GraphContext:
    """The langgraph runtime the executor runs in (store, context, stream writer), if any."""

    runtime: Any
    store: Any

    @classmethod
    def capture(cls) -> _GraphContext:
        try:
            from langgraph.runtime import get_runtime

            runtime = get_runtime()
        except (ImportError, RuntimeError, KeyError):
            runtime = None
        return cls(runtime, getattr(runtime, "store", None))

    def tool_runtime(self, state: Any, call_id: str, config: RunnableConfig,
                     tools: list[BaseTool]) -> Any:
        from langgraph.prebuilt import ToolRuntime

        fields = {f.name for f in dataclasses.fields(ToolRuntime)}
        values: dict[str, Any] = {
            "state": state, "context": getattr(self.runtime, "context", None), "config": config,
            "stream_writer": getattr(self.runtime, "stream_writer", None) or _ignore,
            "tool_call_id": call_id, "store": self.store, "tools": tools,
            "execution_info": getattr(self.runtime, "execution_info", None),
            "server_info": getattr(self.runtime, "server_info", None),
        }
        return ToolRuntime(**{k: v for k, v in values.items() if k in fields})


def _is_graph_node(config: RunnableConfig) -> bool:
    """True when langgraph runs this executor as (part of) a node: the node's run is ours."""
    return "langgraph_node" in (config.get("metadata") or {}) and "__pregel_task_id" in (
        config.get("configurable") or {})


def _for_tools(config: RunnableConfig) -> RunnableConfig:
    """``config`` without the run name / id meant for the node's own run."""
    kept = {k: v for k, v in config.items() if k not in ("run_name", "run_id")}
    return cast(RunnableConfig, kept)


def _ignore(_chunk: Any) -> None:
    """Stream writer used outside a graph: drops what it is given."""


def _retry_matcher(retry_on: Any) -> tuple[type[BaseException], ...] | Callable[..., bool]:
    if isinstance(retry_on, type) and issubclass(retry_on, BaseException):
        return (retry_on,)
    if isinstance(retry_on, tuple) and all(
            isinstance(t, type) and issubclass(t, BaseException) for t in retry_on):
        return retry_on
    if callable(retry_on):
        return retry_on
    raise InvalidRequestError(
        f"retry_on must be an exception type, a tuple of them or a predicate; got {retry_on!r}")



def _tool_items(tools: Any) -> list[Any]:
    """The executor's tools as a list: one tool alone is one tool; a string (a tool's name is
    not a tool) or anything that is not a tool or a function is refused."""
    if isinstance(tools, BaseTool) or (callable(tools) and not isinstance(tools, type)):
        return [tools]
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Iterable):
        raise InvalidArgumentTypeError(
            f"tools must be a list of tools (BaseTool or functions), got "
            f"{type(tools).__name__} {tools!r:.60}")
    items = list(tools)
    for i, item in enumerate(items):
        if not isinstance(item, BaseTool) and not callable(item):
            raise InvalidArgumentTypeError(
                f"tools[{i}] must be a BaseTool or a function, got {type(item).__name__} "
                f"{item!r:.60}")
    return items
