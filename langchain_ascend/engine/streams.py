"""Where a request's output goes: the caller's queue (thread or event loop), its text, its stream.

A driver thread puts :class:`~langchain_ascend.engine.core.outputs.TokenDelta` s (or the
exception that ends the request) into the request's sink; the caller takes them out. Requests
that neither stream nor have stop strings get :class:`LazyText`, decoded once at the end.

Abandoned streams. A stream whose consumer is gone frees its KV blocks at once: a dropped
:class:`SyncTokenStream` aborts its request from its finalizer, and an ``astream`` generator
that is closed, garbage-collected (asyncio's async-generator finalizer closes it) or whose
task is cancelled aborts its request in its ``finally``. A consumer that keeps the stream but
stops reading is caught by a bound: each sink counts the deltas put and taken, and once
``stream_buffer_limit`` deltas lie unread the driver aborts the request (blocks freed, no
more tokens generated); the consumer, if it comes back, reads the buffered deltas and then
:class:`~langchain_ascend.errors.RequestAbortedError` saying why. The bound aborts rather than
pauses so a forgotten stream never pins blocks other requests need; it is generous (1024
deltas by default), so only a consumer that fell that far behind is cut off.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_ascend.engine.core.outputs import RequestOutput, TokenDelta
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.detokenizer import IncrementalDetokenizer, TextDecoder

if TYPE_CHECKING:
    from langchain_ascend.engine.core.scheduler import Scheduler, StepOutput

Item = TokenDelta | BaseException
"""What a sink carries: the next delta, or the error that ends the request."""


class _CountingSink:
    """What both sinks count: items put by the driver and taken by the consumer."""

    def __init__(self) -> None:
        self.num_put = 0  # written by the driver only
        self.num_taken = 0  # written by the consumer only

    @property
    def num_unread(self) -> int:
        """Items put and not yet taken by the consumer."""
        return self.num_put - self.num_taken


class ThreadSink(_CountingSink):
    """Delivers to a thread blocked on a ``queue.Queue``."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: queue.Queue[Item] = queue.Queue()

    def put(self, item: Item) -> bool:
        self.queue.put(item)
        self.num_put += 1
        return True


class AsyncSink(_CountingSink):
    """Delivers to a coroutine awaiting an ``asyncio.Queue`` on its own event loop."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Item] = asyncio.Queue()

    def put(self, item: Item) -> bool:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            return False
        self.num_put += 1
        return True


class LazyText:
    """Detokenizer stand-in for requests that neither stream nor have stop strings: decode
    once at the end."""

    stop_string = None

    def __init__(self, decode: TextDecoder) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self.text = ""
        self._taken = False

    def add_token(self, token_id: int) -> None:
        self._ids.append(token_id)

    def finish(self) -> None:
        self.text = self._decode(self._ids)

    def take_delta(self, *, final: bool = False) -> str:
        if not final or self._taken:
            return ""
        self._taken = True
        return self.text


@dataclass
class Tracked:
    """A live request together with where its output goes."""

    request: Request
    sink: ThreadSink | AsyncSink
    detokenizer: IncrementalDetokenizer | LazyText
    stream: bool

    def step_token_ids(self, out: StepOutput, scheduler: Scheduler) -> list[int]:
        """``out``'s tokens to hand over, fed to the detokenizer (a hidden last token left
        out). A completed stop string finishes the request (``FINISHED_STOPPED``)."""
        request = out.request
        new_ids = list(out.new_token_ids)
        if out.finished and request.last_token_hidden:
            new_ids.pop()
        detok = self.detokenizer
        for index, token_id in enumerate(new_ids):
            detok.add_token(token_id)
            if detok.stop_string is not None:
                # Several tokens came in one step (accepted drafts): keep none past the one
                # that completed the stop string, as one-token steps would have.
                surplus = len(out.new_token_ids) - (index + 1)
                if surplus:
                    del new_ids[index + 1:]
                    if not request.is_finished:
                        scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED,
                                                 stop_reason=detok.stop_string)
                    request.last_token_hidden = False
                    request.truncate_output(request.num_output_tokens - surplus)
                break
        if detok.stop_string is not None:
            if not request.is_finished:
                scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED,
                                         stop_reason=detok.stop_string)
            else:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = detok.stop_string
        return new_ids

    def final_delta(self, new_ids: list[int]) -> TokenDelta:
        """The finished request's last delta, carrying its :class:`RequestOutput`."""
        request, detok = self.request, self.detokenizer
        detok.finish()
        text = detok.take_delta(final=True)
        output = RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=request.returned_token_ids,
            text=detok.text,
            finish_reason=request.status.finish_reason or "stop",
            stop_reason=request.stop_reason,
            stats=request.stats(),
        )
        return TokenDelta(request.request_id, new_ids, text, finished=True,
                          finish_reason=output.finish_reason, output=output)


class SyncTokenStream(Iterator[TokenDelta]):
    """Iterator over one request's deltas; closing it (or dropping it) aborts the request.

    Args:
        request_id: The request's id.
        sink: Where the driver puts its deltas.
        abort: Aborts the request (called at most once, by :meth:`close`).
    """

    def __init__(self, request_id: str, sink: ThreadSink, abort: Callable[[], None]) -> None:
        self.request_id = request_id
        self._sink = sink
        self._abort: Callable[[], None] | None = abort

    def __iter__(self) -> SyncTokenStream:
        return self

    def __next__(self) -> TokenDelta:
        if self._abort is None:
            raise StopIteration
        try:
            item = self._sink.queue.get()
        except BaseException:
            self.close()
            raise
        self._sink.num_taken += 1
        if isinstance(item, BaseException):
            self._abort = None
            raise item
        if item.finished:
            self._abort = None
        return item

    def close(self) -> None:
        """Abort the request if it is still running."""
        abort, self._abort = self._abort, None
        if abort is not None:
            abort()

    def __enter__(self) -> SyncTokenStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
