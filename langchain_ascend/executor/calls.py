"""Pure helpers of :class:`~langchain_ascend.tools.NPUStreamToolExecutor`.

What comes in (input shapes, tool-call validation), what a tool may be given (injected
arguments) and what goes out (ToolMessages, langgraph ``Command``\\ s); what went wrong is
:mod:`.error_policy`. Nothing here runs a tool, starts a thread or touches a device, so the
tests call every function directly.

langgraph is optional: its ``InjectedState`` / ``InjectedStore`` / ``ToolRuntime`` /
``Command`` / ``GraphBubbleUp`` are looked up lazily and simply not recognised without it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages
from langchain_core.tools import BaseTool, InjectedToolArg, StructuredTool, Tool

from langchain_ascend.errors import (
    ToolCallError,
)

InputKind = Literal["message", "messages", "tool_calls", "state"]


# --------------------------------------------------------------------------- langgraph lookups


@functools.lru_cache(maxsize=1)
def _langgraph() -> types.SimpleNamespace | None:
    """langgraph's injection markers and control-flow types, or None when not installed."""
    try:
        from langgraph.errors import GraphBubbleUp
        from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
        from langgraph.types import Command, Send
    except ImportError:
        return None
    return types.SimpleNamespace(
        InjectedState=InjectedState, InjectedStore=InjectedStore, ToolRuntime=ToolRuntime,
        Command=Command, Send=Send, GraphBubbleUp=GraphBubbleUp,
    )


def is_control_flow(exc: BaseException) -> bool:
    """True for langgraph's interrupt / parent-command signals, which must always propagate."""
    lg = _langgraph()
    return lg is not None and isinstance(exc, lg.GraphBubbleUp)


def is_command(value: Any) -> bool:
    """True when ``value`` is a langgraph ``Command``."""
    lg = _langgraph()
    return lg is not None and isinstance(value, lg.Command)


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


# --------------------------------------------------------------------------- injected arguments


@dataclass(frozen=True)
class InjectionSpec:
    """Which of a tool's arguments the executor supplies instead of the model.

    Attributes:
        state: Argument name -> state field (None = the whole state).
        optional_state: State arguments that may be left out when the field is missing.
        store: Argument that receives the langgraph store, if any.
        runtime: Argument that receives a langgraph ``ToolRuntime``, if any.
        hidden: Every injected argument; values the model sends for them are dropped, so a
            model cannot forge them (``InjectedToolCallId`` is then filled in by LangChain).
    """

    state: dict[str, str | None]
    optional_state: frozenset[str]
    store: str | None
    runtime: str | None
    hidden: frozenset[str]

    @property
    def needs_context(self) -> bool:
        """True when the tool wants state, store or runtime."""
        return bool(self.state or self.store or self.runtime)


NO_INJECTION = InjectionSpec({}, frozenset(), None, None, frozenset())


def _annotation_parts(annotation: Any) -> Iterator[Any]:
    """The annotation itself, its ``Annotated`` metadata and the members of unions, recursively."""
    yield annotation
    origin = typing.get_origin(annotation)
    if origin is None:
        return
    yield origin
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        yield from args[1:]
        yield from _annotation_parts(args[0])
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _annotation_parts(arg)


def _is_marker(part: Any, marker: type) -> bool:
    return isinstance(part, marker) or (isinstance(part, type) and issubclass(part, marker))


def _tool_annotations(tool: BaseTool) -> dict[str, Any]:
    annotations: dict[str, Any] = {}
    func = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    if func is not None:
        try:
            annotations.update(typing.get_type_hints(func, include_extras=True))
        except Exception:  # noqa: BLE001 - unresolvable hints: rely on the schema
            pass
    schema = tool.get_input_schema()
    try:
        annotations.update(typing.get_type_hints(schema, include_extras=True))
    except Exception:  # noqa: BLE001
        annotations.update(getattr(schema, "__annotations__", {}))
    annotations.pop("return", None)
    return annotations


def injection_spec(tool: BaseTool) -> InjectionSpec:
    """Find the arguments of ``tool`` that are injected rather than chosen by the model.

    Mirrors langgraph's ToolNode: ``Annotated[..., InjectedState]`` (whole state) or
    ``InjectedState("field")``, ``Annotated[..., InjectedStore()]``, a ``ToolRuntime``-typed
    argument or one named ``runtime``; any ``InjectedToolArg`` is hidden from the model.
    """
    lg = _langgraph()
    fields = getattr(tool.get_input_schema(), "model_fields", {})
    state: dict[str, str | None] = {}
    optional: set[str] = set()
    hidden: set[str] = set()
    store = runtime = None
    for arg, annotation in _tool_annotations(tool).items():
        parts = list(_annotation_parts(annotation))
        if any(_is_marker(p, InjectedToolArg) for p in parts):
            hidden.add(arg)
        if lg is None:
            continue
        if arg == "runtime" or any(_is_marker(p, lg.ToolRuntime) for p in parts):
            runtime = arg
            hidden.add(arg)
        if any(_is_marker(p, lg.InjectedStore) for p in parts):
            store = arg
        marker = next((p for p in parts if _is_marker(p, lg.InjectedState)), None)
        if marker is not None:
            state[arg] = getattr(marker, "field", None) if not isinstance(marker, type) else None
            field_info = fields.get(arg)
            if state[arg] and field_info is not None and not field_info.is_required():
                optional.add(arg)
    if not (state or store or runtime or hidden):
        return NO_INJECTION
    return InjectionSpec(state, frozenset(optional), store, runtime, frozenset(hidden))


def inject_args(
    args: dict[str, Any],
    spec: InjectionSpec,
    *,
    tool_name: str,
    state: Any,
    messages_key: str,
    store: Any,
    runtime_factory: Callable[[], Any] | None,
) -> dict[str, Any]:
    """Return ``args`` without model-sent injected values, plus the executor's own.

    Raises:
        ToolCallError: The tool needs state the input does not carry, or a store when the
            graph was compiled without one.
    """
    if spec is NO_INJECTION:
        return args
    out = {k: v for k, v in args.items() if k not in spec.hidden}
    if spec.state:
        view = state
        if view is None:
            raise ToolCallError(
                f"tool {tool_name!r} needs graph state (InjectedState); pass a state dict or a "
                "list of messages, not bare tool calls")
        if isinstance(view, list):
            wanted = set(spec.state.values())
            if not wanted <= {None, messages_key}:
                fields = ", ".join(sorted(f for f in wanted if f))
                raise ToolCallError(
                    f"tool {tool_name!r} needs state fields {fields}; pass a state dict")
            view = {messages_key: view}
        for arg, field in spec.state.items():
            if field is None:
                out[arg] = view
            elif isinstance(view, dict) and field in view:
                out[arg] = view[field]
            elif not isinstance(view, dict) and hasattr(view, field):
                out[arg] = getattr(view, field)
            elif arg not in spec.optional_state:
                raise ToolCallError(f"tool {tool_name!r} needs state field {field!r}, which the "
                                    "state does not have")
    if spec.store:
        if store is None:
            raise ToolCallError(f"tool {tool_name!r} needs a store (InjectedStore): compile the "
                                "graph with store=... ")
        out[spec.store] = store
    if spec.runtime and runtime_factory is not None:
        out[spec.runtime] = runtime_factory()
    return out


# --------------------------------------------------------------------------- tool capabilities


def has_sync_body(tool: BaseTool) -> bool:
    """False for tools built from a coroutine only (their ``invoke`` would raise)."""
    if isinstance(tool, (StructuredTool, Tool)):
        return tool.func is not None
    return True


def has_async_body(tool: BaseTool) -> bool:
    """True when ``ainvoke`` runs native async code rather than the sync body in an executor."""
    if isinstance(tool, (StructuredTool, Tool)):
        return tool.coroutine is not None
    return type(tool)._arun is not BaseTool._arun


def schema_title(tool: BaseTool) -> str | None:
    """Title pydantic puts on a ValidationError raised while parsing this tool's arguments."""
    schema = tool.get_input_schema()
    return getattr(schema, "__name__", None)


def describe_validation_error(exc: Any, hidden: frozenset[str]) -> str:
    """``field: message`` lines of a pydantic ValidationError, injected fields left out."""
    lines = []
    for error in exc.errors():
        loc = tuple(error.get("loc", ()))
        if loc and loc[0] in hidden:
            continue
        where = ".".join(str(part) for part in loc) or "(arguments)"
        lines.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(lines) or str(exc)


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
    lg = _langgraph()
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
