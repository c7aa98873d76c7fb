"""What an executor invocation hands back: one ToolMessage (or langgraph ``Command``) per call,
in call order, each with its ``tool_timing``; failures rendered by the error policy; result
tensors of a device stream joined to the caller's stream first."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage

from langchain_ascend.errors import ToolCallError
from langchain_ascend.executor.call_types import CallRecord, Plan
from langchain_ascend.executor.calls import (
    PreparedCall,
    check_command,
    combine_outputs,
    content_of,
    error_message,
)
from langchain_ascend.executor.error_policy import ErrorPolicy
from langchain_ascend.executor.langgraph_names import is_command
from langchain_ascend.executor.workers import StreamResult, device_tensors


def finish(plan: Plan, records: list[CallRecord], policy: ErrorPolicy, messages_key: str) -> Any:
    """One output per call of ``plan``, in call order, shaped like ToolNode's (see
    :func:`~.calls.combine_outputs`); every ToolMessage carries its ``tool_timing``."""
    origin = records[0].submitted if records else 0.0
    by_index = {call.index: (spec, record) for call, spec, record
                in zip(plan.runnable, plan.specs, records, strict=True)}
    outputs: list[Any] = []
    for call in plan.prepared:
        if call.problem is not None:
            outputs.append(error_message(
                call, policy.render(call.problem, call.name)))
            continue
        spec, record = by_index[call.index]
        timing = record.timing(origin)
        timing["mode"] = "async" if spec.run_in_thread is None else "thread"
        timing["stream"] = None
        outputs.append(_output(call, record, timing, plan, policy, messages_key))
    return combine_outputs(outputs, plan.kind, messages_key)

def _output(call: PreparedCall, record: CallRecord, timing: dict[str, Any], plan: Plan,
            policy: ErrorPolicy, messages_key: str) -> Any:
    if not record.ok:
        assert record.error is not None
        message = error_message(call, policy.render(record.error, call.name))
        return with_timing(message, timing)
    value = record.value
    if isinstance(value, StreamResult):
        streams = plan.streams
        assert streams is not None
        streams.join(value, device_tensors(value.value, streams.device))
        timing["stream"] = value.stream
        value = value.value
    try:
        return _normalize(value, call, timing, messages_key)
    except ToolCallError as exc:
        if not policy.handles(exc):
            raise
        message = error_message(call, policy.render(exc, call.name))
        return with_timing(message, timing)

def _normalize(value: Any, call: PreparedCall, timing: dict[str, Any], messages_key: str) -> Any:
    if isinstance(value, ToolMessage):
        content = content_of(value.content)
        if content is not value.content:
            value.content = content
        return with_timing(value, timing)
    if is_command(value):
        command = check_command(value, call, messages_key)
        update = command.update
        messages = update.get(messages_key) if isinstance(update, dict) else update
        for message in messages if isinstance(messages, list) else []:
            if isinstance(message, ToolMessage) and message.tool_call_id == call.id:
                with_timing(message, timing)
        return command
    if isinstance(value, list) and value and all(
            isinstance(v, ToolMessage) or is_command(v) for v in value):
        return [_normalize(v, call, timing, messages_key) for v in value]
    message = ToolMessage(content=content_of(value), name=call.name,
                          tool_call_id=call.id)
    return with_timing(message, timing)


def with_timing(message: ToolMessage, timing: dict[str, Any]) -> ToolMessage:
    message.response_metadata = {**message.response_metadata, "tool_timing": timing}
    return message
