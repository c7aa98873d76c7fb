"""What a tool may be given besides the model's arguments, and what it can run.

:func:`injection_spec` finds the arguments the executor supplies (langgraph's
``InjectedState`` / ``InjectedStore`` / ``ToolRuntime``, any ``InjectedToolArg``) as ToolNode
does, and :func:`inject_args` fills them in; :func:`has_sync_body` / :func:`has_async_body` say
how a tool can run, :func:`describe_validation_error` words a bad-arguments error for the model.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from langchain_core.tools import BaseTool, InjectedToolArg, StructuredTool, Tool

from langchain_ascend.errors import ToolCallError
from langchain_ascend.executor.langgraph_names import langgraph_names


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
    lg = langgraph_names()
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
