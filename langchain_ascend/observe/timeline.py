"""``AscendTimeline``: a LangChain callback handler that records where an agent's time goes.

It listens to chat-model, tool, retriever and chain callbacks and keeps one span per hop, per
tool call and per retrieval (:mod:`langchain_ascend.observe.records`), then writes them as a
Chrome / Perfetto trace, a PNG chart and a text table. Thread-safe (one lock around the
state); the same handler can watch sync, async and ``batch`` runs at once, each top-level run
kept apart.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from langchain_ascend.observe.chart import write_png
from langchain_ascend.observe.chrome_trace import trace_dict, write_trace
from langchain_ascend.observe.npu_profile import start_profiler
from langchain_ascend.observe.records import (
    HopSpan,
    RetrievalSpan,
    Snapshot,
    ToolSpan,
)
from langchain_ascend.observe.summary import summary_table


class AscendTimeline(BaseCallbackHandler):
    """Record every hop of an agent: queue wait, prefill (new vs cached prompt tokens),
    decode (tokens, tokens per forward pass), each tool call (start, end, status, retries)
    and each retrieval; write them as a trace, a chart and a table.

    What is read from where:

    * chat-model hops: ``on_chat_model_start`` / ``on_llm_end``; from the reply's
      ``usage_metadata``: ``input_tokens``, ``output_tokens``,
      ``input_token_details["cache_read"]``; from ``response_metadata["timings"]``
      (``AscendChatModel`` sets it): ``queue``, ``time_to_first_token``, ``decode``; from
      ``response_metadata["speculative"]`` (``forward_passes``) the tokens per pass. Other
      chat models give tokens when they report usage, and a prefill/decode split when
      streamed (first token time).
    * tool calls: ``on_tool_start`` / ``on_tool_end`` / ``on_tool_error``, one span per
      ``tool_call_id`` under its parent run, each start of the same call counted as an attempt.
      When :class:`~langchain_ascend.NPUStreamToolExecutor` finishes, the
      ``tool_timing`` of its ``ToolMessage`` s fills in what callbacks cannot show: retries,
      and ``"timeout"`` for a call the executor gave up on (its thread never ended).
    * tool results prefilled while the tools ran (``AscendChatModel`` with an agent session):
      the hop they fed lists them (``response_metadata["tool_time_prefills"]``) and the trace
      draws them as ``tool-time prefill`` slices on the tools' own timeline.
    * retrieval: ``on_retriever_start`` / ``on_retriever_end``. LangChain has no embedding
      callbacks; the query's embedding time is inside the retrieval span.

    Calls that fail before a tool runs (an unknown tool name, invalid JSON arguments) fire no
    tool callback and are not shown.

    Args:
        profile_npu: Also record the device with ``torch_npu.profiler`` while the timeline is
            used as a context manager (``with AscendTimeline(profile_npu=True) as tl:``);
            MindStudio Insight opens the result (``profile_dir``). Needs torch_npu and an NPU:
            :class:`~langchain_ascend.errors.DeviceUnavailableError` otherwise.
        profile_dir: Where the profiler writes (default ``./ascend_profile``).

    As a context manager it watches every run started inside the block, as langchain_core's
    ``get_usage_metadata_callback()`` does (a ``ContextVar`` configure hook,
    :mod:`langchain_ascend.observe.attach`): no ``callbacks=`` to thread through.

    Example:
        .. code-block:: python

            from langchain_ascend import AscendTimeline

            with AscendTimeline() as timeline:
                agent.invoke({"messages": [...]})
            # or: agent.invoke(..., config={"callbacks": [timeline]})
            print(timeline.summary())
            timeline.write_chrome_trace("trace.json")   # chrome://tracing or ui.perfetto.dev
            timeline.write_png("timeline.png")
    """

    run_inline = True  # cheap, locked: no thread-pool hop for async runs
    raise_error = False

    def __init__(self, *, profile_npu: bool = False,
                 profile_dir: str | Path = "ascend_profile") -> None:
        super().__init__()
        self.profile_npu = profile_npu
        self.profile_dir = Path(profile_dir)
        self._lock = threading.Lock()
        self._origin: float | None = None
        self._parents: dict[str, str | None] = {}
        self._chain_names: dict[str, str] = {}
        self._hops: dict[str, HopSpan] = {}
        self._tools: dict[str, ToolSpan] = {}
        self._tools_of: dict[str, list[ToolSpan]] = {}  # parent run id -> its tool calls
        self._attempts: dict[str, str] = {}  # tool run id -> ToolSpan key
        self._retrievals: dict[str, RetrievalSpan] = {}
        self._profiler: Any = None
        self._attachments: list[Any] = []  # observe.attach.Attachment per open ``with``

    # ------------------------------------------------------------------ bookkeeping

    def _now(self) -> float:
        now = time.perf_counter()
        if self._origin is None:
            self._origin = now
        return now - self._origin

    def _register(self, run_id: UUID, parent_run_id: UUID | None) -> str:
        rid = str(run_id)
        self._parents[rid] = None if parent_run_id is None else str(parent_run_id)
        return rid

    def _root(self, rid: str) -> str:
        seen = 0
        while (parent := self._parents.get(rid)) is not None and seen < 10_000:
            rid, seen = parent, seen + 1
        return rid

    def reset(self) -> None:
        """Forget everything recorded (the next event starts the clock again)."""
        with self._lock:
            self._origin = None
            for table in (self._parents, self._chain_names, self._hops, self._tools,
                          self._tools_of, self._attempts, self._retrievals):
                table.clear()

    def snapshot(self) -> Snapshot:
        """A copy of the spans recorded so far (safe to read while runs continue)."""
        with self._lock:
            roots = {rid for rid, parent in self._parents.items()
                     if parent is None and rid in self._chain_names}
            return Snapshot(
                hops=copy.deepcopy(list(self._hops.values())),
                tools=copy.deepcopy(list(self._tools.values())),
                retrievals=copy.deepcopy(list(self._retrievals.values())),
                root_names={rid: self._chain_names[rid] for rid in roots},
                chain_roots=roots,
            )

    @property
    def hops(self) -> list[HopSpan]:
        """Chat-model hops recorded so far, in start order."""
        return sorted(self.snapshot().hops, key=lambda h: h.start)

    @property
    def tool_calls(self) -> list[ToolSpan]:
        """Tool calls recorded so far, in start order."""
        return sorted(self.snapshot().tools, key=lambda t: t.start)

    @property
    def retrievals(self) -> list[RetrievalSpan]:
        """Retrievals recorded so far, in start order."""
        return sorted(self.snapshot().retrievals, key=lambda r: r.start)

    # ------------------------------------------------------------------ chains

    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        with self._lock:
            self._now()
            rid = self._register(run_id, parent_run_id)
            name = kwargs.get("name") or (serialized or {}).get("name") or "run"
            self._chain_names[rid] = str(name)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._close_tools_of(str(run_id), outputs)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._close_tools_of(str(run_id), None, error)

    def _close_tools_of(self, chain_id: str, outputs: Any,
                        error: BaseException | None = None) -> None:
        """When the run that ran tools ends: fill in the executor's ``tool_timing`` and close
        calls still open (an attempt the executor abandoned at its deadline)."""
        timings = {m.tool_call_id: m for m in _tool_messages(outputs)}
        with self._lock:
            now = self._now()
            for span in self._tools_of.pop(chain_id, []):
                message = timings.get(span.tool_call_id or "")
                timing = (message.response_metadata or {}).get("tool_timing") if message else None
                if message is not None and isinstance(timing, dict):
                    span.attempts = max(span.attempts, int(timing.get("attempts") or 0))
                    span.retries = max(span.retries, int(timing.get("retries") or 0))
                    if timing.get("timed_out"):
                        span.status = "timeout"
                        span.error = span.error or str(message.content)[:200]
                        if span.end is None:
                            run_s = float(timing.get("end_ms", 0)) - float(timing.get("start_ms", 0))
                            span.end = min(now, span.start + max(run_s, 0.0) / 1e3)
                if message is not None and getattr(message, "status", "") == "error" and \
                        span.status == "ok":
                    span.status = "error"
                    span.error = str(message.content)[:200]
                if span.end is None:
                    span.end = now
                    if span.status == "running":
                        span.status = "error" if error is not None else "timeout"
                        if error is not None:
                            span.error = _error_text(error)
                span.open_attempts.clear()

    # ------------------------------------------------------------------ chat models

    def on_chat_model_start(self, serialized: dict[str, Any] | None,
                            messages: list[list[Any]], *, run_id: UUID,
                            parent_run_id: UUID | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        with self._lock:
            start = self._now()
            rid = self._register(run_id, parent_run_id)
            self._hops[rid] = HopSpan(run_id=rid, root_id=self._root(rid),
                                      model=_model_name(serialized, metadata, kwargs),
                                      start=start)

    def on_llm_start(self, serialized: dict[str, Any] | None, prompts: list[str], *,
                     run_id: UUID, parent_run_id: UUID | None = None,
                     metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.on_chat_model_start(serialized, [], run_id=run_id, parent_run_id=parent_run_id,
                                 metadata=metadata, **kwargs)

    def on_llm_new_token(self, token: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            hop = self._hops.get(str(run_id))
            if hop is not None and hop.first_token is None:
                hop.first_token = self._now()

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        message = _first_message(response)
        with self._lock:
            hop = self._hops.get(str(run_id))
            if hop is None:
                return
            hop.end = self._now()
            if message is not None:
                fill_hop(hop, message)
                hop.tool_time_prefills = [
                    (hop.end - float(p["start_ago"]), hop.end - float(p["end_ago"]),
                     int(p["tokens"]))
                    for p in (message.response_metadata or {}).get("tool_time_prefills", [])]

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            hop = self._hops.get(str(run_id))
            if hop is not None:
                hop.end = self._now()
                hop.error = _error_text(error)

    # ------------------------------------------------------------------ tools

    def on_tool_start(self, serialized: dict[str, Any] | None, input_str: str, *,
                      run_id: UUID, parent_run_id: UUID | None = None,
                      inputs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        with self._lock:
            start = self._now()
            rid = self._register(run_id, parent_run_id)
            call_id = kwargs.get("tool_call_id")
            parent = None if parent_run_id is None else str(parent_run_id)
            key = f"{parent}/{call_id}" if call_id else rid
            span = self._tools.get(key)
            if span is None:
                name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
                span = self._tools[key] = ToolSpan(
                    key=key, root_id=self._root(rid), parent_id=parent, name=str(name),
                    tool_call_id=call_id, start=start)
                self._tools_of.setdefault(str(parent), []).append(span)
            elif span.end is not None and not span.open_attempts:
                span.end = None  # a retry: the call is running again
            span.attempts += 1
            span.retries = max(span.retries, span.attempts - 1)
            span.status = "running"
            span.open_attempts.add(rid)
            self._attempts[rid] = key

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        failed = getattr(output, "status", "success") == "error"
        self._end_attempt(str(run_id), "error" if failed else "ok",
                          str(getattr(output, "content", ""))[:200] if failed else None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_attempt(str(run_id), "error", _error_text(error))

    def _end_attempt(self, rid: str, status: str, error: str | None) -> None:
        with self._lock:
            now = self._now()
            span = self._tools.get(self._attempts.get(rid, ""))
            if span is None or rid not in span.open_attempts:
                return  # an attempt that ended after its call was closed (abandoned thread)
            span.open_attempts.discard(rid)
            span.end = now if span.end is None else max(span.end, now)
            span.status = status  # type: ignore[assignment]
            span.error = error

    # ------------------------------------------------------------------ retrievers

    def on_retriever_start(self, serialized: dict[str, Any] | None, query: str, *,
                           run_id: UUID, parent_run_id: UUID | None = None,
                           **kwargs: Any) -> None:
        with self._lock:
            start = self._now()
            rid = self._register(run_id, parent_run_id)
            name = kwargs.get("name") or (serialized or {}).get("name") or "retriever"
            self._retrievals[rid] = RetrievalSpan(run_id=rid, root_id=self._root(rid),
                                                  name=str(name), query=str(query), start=start)

    def on_retriever_end(self, documents: Sequence[Any], *, run_id: UUID,
                         **kwargs: Any) -> None:
        with self._lock:
            span = self._retrievals.get(str(run_id))
            if span is not None:
                span.end = self._now()
                span.num_documents = len(documents)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID,
                           **kwargs: Any) -> None:
        with self._lock:
            span = self._retrievals.get(str(run_id))
            if span is not None:
                span.end = self._now()
                span.error = _error_text(error)

    # ------------------------------------------------------------------ outputs

    def write_chrome_trace(self, path: str | Path) -> Path:
        """Write a Chrome / Perfetto trace (``chrome://tracing``, ui.perfetto.dev) to ``path``.

        See :func:`langchain_ascend.observe.chrome_trace.trace_events` for its layout.
        """
        return write_trace(self.snapshot(), Path(path))

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace :meth:`write_chrome_trace` writes, as a dict."""
        return trace_dict(self.snapshot())

    def write_png(self, path: str | Path, *, title: str | None = None) -> Path:
        """Draw the runs' hops and tool calls over time (matplotlib, Agg) into ``path``.

        Needs the ``plot`` extra (``pip install 'langchain-ascend[plot]'``): a
        :class:`~langchain_ascend.errors.MissingExtraError` (an ``ImportError``) without it.
        """
        return write_png(self.snapshot(), Path(path), title=title)

    def summary(self) -> str:
        """A text table: per hop tokens in / cached / out and times, per tool call duration,
        status and retries, per retrieval duration and documents; totals last."""
        return summary_table(self.snapshot())

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> AscendTimeline:
        """Watch every run started inside the block (no ``callbacks=`` needed), and start
        the NPU profiler with ``profile_npu``."""
        # attach loads langchain_core's tracer hooks (langsmith, requests: ~650 modules), which
        # a timeline only written or read does not need.
        from langchain_ascend.observe.attach import attach

        self._attachments.append(attach(self))
        if self.profile_npu:
            self._profiler = start_profiler(self.profile_dir)
        return self

    def __exit__(self, *exc: object) -> None:
        from langchain_ascend.observe.attach import detach

        profiler, self._profiler = self._profiler, None
        try:
            if profiler is not None:
                profiler.stop()
        finally:
            if self._attachments:
                detach(self._attachments.pop())


# ---------------------------------------------------------------------- helpers


def fill_hop(hop: HopSpan, message: Any) -> None:
    """Copy tokens, engine timings and speculation figures from an ``AIMessage`` into ``hop``."""
    usage = getattr(message, "usage_metadata", None) or {}
    hop.input_tokens = int(usage.get("input_tokens") or 0)
    hop.output_tokens = int(usage.get("output_tokens") or 0)
    details = usage.get("input_token_details") or {}
    hop.cached_tokens = int(details.get("cache_read") or 0)
    metadata = getattr(message, "response_metadata", None) or {}
    timings = metadata.get("timings")
    if isinstance(timings, dict):
        hop.queue_s = _seconds(timings.get("queue"))
        hop.ttft_s = _seconds(timings.get("time_to_first_token"))
        hop.decode_s = _seconds(timings.get("decode"))
    hop.finish_reason = metadata.get("finish_reason")
    hop.num_tool_calls = len(getattr(message, "tool_calls", None) or [])
    speculative = metadata.get("speculative")
    if isinstance(speculative, dict):
        hop.speculative = {k: int(v) for k, v in speculative.items()
                           if isinstance(v, (int, float))}
        passes = hop.speculative.get("forward_passes") or 0
        hop.tokens_per_pass = hop.output_tokens / passes if passes > 0 else 1.0
    else:
        hop.tokens_per_pass = 1.0


def _seconds(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _first_message(response: Any) -> Any:
    generations = getattr(response, "generations", None) or []
    for group in generations:
        for generation in group:
            message = getattr(generation, "message", None)
            if message is not None:
                return message
    return None


def _model_name(serialized: dict[str, Any] | None, metadata: dict[str, Any] | None,
                kwargs: dict[str, Any]) -> str:
    metadata = metadata or {}
    for value in (metadata.get("ls_model_name"), kwargs.get("name"),
                  (serialized or {}).get("name")):
        if value:
            text = str(value)
            return text.rsplit("/", 1)[-1] if "/" in text else text
    return "chat model"


def _tool_messages(outputs: Any) -> list[Any]:
    """The ``ToolMessage`` s in an executor's output (a list, or a ``{"messages": [...]}``)."""
    from langchain_core.messages import ToolMessage

    if isinstance(outputs, dict):
        outputs = outputs.get("messages", outputs.get("output"))
    if isinstance(outputs, ToolMessage):
        return [outputs]
    if isinstance(outputs, (list, tuple)):
        return [m for m in outputs if isinstance(m, ToolMessage)]
    return []


def _error_text(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}"[:200] if text else type(error).__name__
