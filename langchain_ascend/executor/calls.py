"""What comes in and what goes out of :class:`~langchain_ascend.tools.NPUStreamToolExecutor`.

Input shapes and tool-call validation in, ToolMessages and langgraph ``Command``\\ s out;
what a tool may be given is :mod:`.injection`, what went wrong :mod:`.error_policy`. Nothing
here runs a tool, starts a thread or touches a device, so the tests call every function
directly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages
from langchain_core.tools import BaseTool

from langchain_ascend.errors import ToolCallError
from langchain_ascend.executor.injection import (  # calls' old home of these names
    NO_INJECTION,
    InjectionSpec,
    inject_args,
    injection_spec,
)
from langchain_ascend.executor.langgraph_names import (
    is_command,
    is_control_flow,
    langgraph_names,
)

__all__ = [
    "NO_INJECTION",
    "InjectionSpec",
    "ParsedInput",
    "PreparedCall",
    "check_command",
    "combine_outputs",
    "content_of",
    "error_message",
    "inject_args",
    "injection_spec",
    "is_command",
    "is_control_flow",
    "parse_input",
    "prepare_calls",
]

InputKind = Literal["message", "messages", "tool_calls", "state"]


# --------------------------------------------------------------------------- input parsing


@dataclass(frozen=True)
class ParsedInput:
    """The tool calls found in an executor input.

    Attributes:
        calls: The raw tool calls, in order, exactly as given (validated later).
        kind: ``"message"`` (an AIMessage), ``"messages"`` (a list of messages),
            ``"tool_calls"`` (a list of ToolCall dicts) or ``"state"`` (a dict or object with
            a messages field). ``"state"`` input gets ``{messages_key: [...]}`` back, every other
            kind a plain list.
        state: What ``InjectedState`` / ``ToolRuntime.state`` see: the state itself, or the
            list of messages.
    """

    calls: list[Any]
    kind: InputKind
    state: Any


def _looks_like_tool_call(item: Any) -> bool:
    return isinstance(item, dict) and (
        item.get("type") == "tool_call"
        or ("name" in item and "args" in item and "role" not in item)
    )


def _last_ai_message(messages: Sequence[Any]) -> AIMessage | None:
    if not all(isinstance(m, BaseMessage) for m in messages):
        try:
            messages = convert_to_messages(messages)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is bad input
            raise ToolCallError(f"could not read the input messages: {exc}") from exc
    return next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)


def parse_input(value: Any, messages_key: str = "messages") -> ParsedInput:
    """Find the tool calls in any input shape langgraph's ToolNode accepts.

    Args:
        value: An ``AIMessage``; a list of messages (the last ``AIMessage`` is used, as in
            ToolNode); a list of ToolCall dicts (or one); langgraph's ``Send`` payload
            ``{"__type": "tool_call_with_context", "tool_call": ..., "state": ...}``; a state
            dict / object with a ``messages_key`` field.
        messages_key: The state field holding the messages.

    Returns:
        The calls, the input kind and the state for injection. No tool calls (or no
        ``AIMessage`` at all) gives an empty ``calls`` list, not an error.

    Raises:
        ToolCallError: The input is none of the shapes above.
    """
    if isinstance(value, AIMessage):
        return ParsedInput(list(value.tool_calls), "message", [value])
    if isinstance(value, (list, tuple)):
        items = list(value)
        if items and _looks_like_tool_call(items[-1]):
            return ParsedInput(items, "tool_calls", None)
        ai = _last_ai_message(items)
        return ParsedInput(list(ai.tool_calls) if ai else [], "messages", items)
    if isinstance(value, dict):
        if value.get("type") == "tool_call":
            return ParsedInput([value], "tool_calls", None)
        if value.get("__type") == "tool_call_with_context":  # langgraph Send payload
            return ParsedInput([value.get("tool_call")], "tool_calls", value.get("state"))
        if messages_key not in value:
            raise ToolCallError(
                f"the state dict has no {messages_key!r} key (keys: {sorted(map(str, value))}); "
                "pass an AIMessage, a list of messages, a list of tool calls or a state with "
                f"{messages_key!r}")
        messages = value[messages_key] or []
        if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
            raise ToolCallError(
                f"state[{messages_key!r}] must be a list of messages, got "
                f"{type(messages).__name__} {messages!r:.60}")
        ai = _last_ai_message(list(messages))
        return ParsedInput(list(ai.tool_calls) if ai else [], "state", value)
    messages = getattr(value, messages_key, None)
    if isinstance(messages, (list, tuple)):
        ai = _last_ai_message(list(messages))
        return ParsedInput(list(ai.tool_calls) if ai else [], "state", value)
    raise ToolCallError(
        f"cannot find tool calls in a {type(value).__name__}: pass an AIMessage, a list of "
        f"messages, a list of tool calls or a state with {messages_key!r}")


# --------------------------------------------------------------------------- call validation


@dataclass
class PreparedCall:
    """One tool call, checked and ready to run (or to be answered with its problem).

    Attributes:
        index: Position in the input; outputs keep this order.
        id: ``tool_call_id`` (a synthetic ``"<name>-<index>"`` when the call had none).
        name: Tool name as requested.
        args: Arguments as a dict (a JSON-object string is decoded); None when unusable.
        tool: The tool, or None when the name is unknown.
        problem: Why the call cannot run; such a call is never executed.
    """

    index: int
    id: str
    name: str
    args: dict[str, Any] | None
    tool: BaseTool | None
    problem: ToolCallError | None = None


def _decode_args(args: Any) -> tuple[dict[str, Any] | None, str | None]:
    if args is None:
        return {}, None
    if isinstance(args, dict):
        return args, None
    if isinstance(args, str):
        try:
            decoded = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f"its arguments are not valid JSON ({exc.msg} at position {exc.pos})"
        if isinstance(decoded, dict):
            return decoded, None
        args = decoded
    return None, f"its arguments must be a JSON object, got {type(args).__name__}"


def prepare_calls(raw_calls: Sequence[Any],
                  tools_by_name: dict[str, BaseTool]) -> list[PreparedCall]:
    """Check every raw call; problems are recorded on the call, never raised.

    Rules: a call must be a dict with a non-empty string ``name`` naming a known tool, and
    ``args`` that are a dict (or a JSON-object string, or missing = no arguments). A missing
    ``id`` is replaced by ``"<name>-<index>"``. A ``tool_call_id`` used twice keeps its first
    call; later ones are not run (a side-effecting tool would otherwise run twice) and are
    answered with an error.
    """
    prepared: list[PreparedCall] = []
    first_index_of: dict[str, int] = {}
    available = ", ".join(sorted(tools_by_name)) or "(none)"
    for index, raw in enumerate(raw_calls):
        if not isinstance(raw, dict):
            prepared.append(PreparedCall(index, f"invalid-{index}", "", None, None, ToolCallError(
                f"tool call #{index} is a {type(raw).__name__}, not a dict with name/args/id")))
            continue
        name = raw.get("name")
        name_text = name if isinstance(name, str) else ""
        call_id = raw.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"{name_text or 'tool'}-{index}"
        args, args_problem = _decode_args(raw.get("args"))
        call = PreparedCall(index, call_id, name_text, args, tools_by_name.get(name_text))
        if not name_text:
            call.problem = ToolCallError(f"tool call #{index} has no tool name")
        elif call.tool is None:
            call.problem = ToolCallError(
                f"there is no tool named {name_text!r}; available tools: {available}")
        elif args_problem:
            call.problem = ToolCallError(f"tool call {name_text!r} is invalid: {args_problem}")
        elif call_id in first_index_of:
            call.problem = ToolCallError(
                f"tool_call_id {call_id!r} is used by calls #{first_index_of[call_id]} and "
                f"#{index}; only the first was run")
        first_index_of.setdefault(call_id, index)
        prepared.append(call)
    return prepared


# --------------------------------------------------------------------------- outputs


def content_of(value: Any) -> str | list[Any]:
    """Valid ToolMessage content: strings and content-block lists pass, the rest as JSON / str."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
            isinstance(v, str) or (isinstance(v, dict) and "type" in v) for v in value):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def error_message(call: PreparedCall, content: str) -> ToolMessage:
    """An error ToolMessage bound to ``call``."""
    return ToolMessage(content=content, name=call.name, tool_call_id=call.id, status="error")


def check_command(command: Any, call: PreparedCall, messages_key: str) -> Any:
    """Accept a langgraph ``Command`` returned by a tool, as ToolNode does.

    A command for the current graph that updates messages must carry a ToolMessage answering
    this call (its ``name`` is filled in); a ``Command`` without message updates passes.

    Raises:
        ToolCallError: The update has messages but none answers this call.
    """
    update = command.update
    if isinstance(update, dict):
        messages = update.get(messages_key)
    elif isinstance(update, list):
        messages = update
    else:
        return command
    if messages is None:
        return command
    converted = convert_to_messages(messages)
    answered = False
    for message in converted:
        if isinstance(message, ToolMessage) and message.tool_call_id == call.id:
            message.name = message.name or call.name
            answered = True
    if command.graph is None and converted and not answered:
        raise ToolCallError(
            f"tool {call.name!r} returned a Command whose {messages_key!r} update has no "
            f"ToolMessage with tool_call_id {call.id!r}; every tool call needs one")
    new_update: Any = ({**update, messages_key: converted} if isinstance(update, dict)
                       else converted)
    return dataclasses.replace(command, update=new_update)


def combine_outputs(outputs: Sequence[Any], kind: InputKind, messages_key: str) -> Any:
    """Shape the per-call outputs like ToolNode.

    Only ToolMessages: a list (``{messages_key: list}`` for state input). With ``Command``\\ s:
    a list in call order where each ToolMessage is wrapped as an update and parent-graph
    commands that only ``Send`` are merged into one, last.
    """
    flat: list[Any] = []
    for output in outputs:
        flat.extend(output if isinstance(output, list) else [output])
    if not any(is_command(item) for item in flat):
        return {messages_key: flat} if kind == "state" else flat
    lg = langgraph_names()
    assert lg is not None  # a Command was recognised, so langgraph is installed
    combined: list[Any] = []
    parent_sends: list[Any] = []
    for item in flat:
        if is_command(item):
            goto = item.goto
            if (item.graph == lg.Command.PARENT and isinstance(goto, list) and goto
                    and all(isinstance(s, lg.Send) for s in goto)):
                parent_sends.extend(goto)
            else:
                combined.append(item)
        else:
            combined.append({messages_key: [item]} if kind == "state" else [item])
    if parent_sends:
        combined.append(lg.Command(graph=lg.Command.PARENT, goto=parent_sends))
    return combined
