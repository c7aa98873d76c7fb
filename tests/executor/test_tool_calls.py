"""The pure helpers behind NPUStreamToolExecutor: input shapes, call checks, injection specs
and output shaping (the error policy: test_error_policy.py)."""

from __future__ import annotations

from typing import Annotated, Any, Union

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
from langgraph.types import Command, Send
from tool_test_helpers import ai, tool_call

from langchain_ascend.errors import ToolCallError
from langchain_ascend.executor import calls as tc


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def stateful(
    x: int,
    whole: Annotated[dict, InjectedState],
    msgs: Annotated[list, InjectedState("messages")],
    extra: Annotated[Union[str, None], InjectedState("extra")] = None,  # noqa: UP007
    store: Annotated[Any, InjectedStore()] = None,
    call_id: Annotated[str, InjectedToolCallId] = "",
) -> str:
    """Uses every kind of injection."""
    return "ok"


@tool
def with_runtime(x: int, runtime: ToolRuntime) -> str:
    """Reads the runtime."""
    return "ok"


TOOLS = {"add": add, "stateful": stateful}


class TestParseInput:
    def test_ai_message(self) -> None:
        message = ai(tool_call("add", "1", a=1, b=2))
        parsed = tc.parse_input(message)
        assert parsed.kind == "message"
        assert [c["id"] for c in parsed.calls] == ["1"]

    def test_message_list_uses_last_ai_message(self) -> None:
        old = ai(tool_call("add", "old", a=1, b=1))
        new = ai(tool_call("add", "new", a=2, b=2))
        parsed = tc.parse_input([HumanMessage("hi"), old, new, ToolMessage("x", tool_call_id="z")])
        assert parsed.kind == "messages"
        assert [c["id"] for c in parsed.calls] == ["new"]

    def test_state_dict_and_object(self) -> None:
        state = {"messages": [ai(tool_call("add", "1", a=1, b=2))], "extra": 3}
        parsed = tc.parse_input(state)
        assert (parsed.kind, parsed.state) == ("state", state)

        class State:
            messages = [ai(tool_call("add", "2", a=1, b=2))]

        assert tc.parse_input(State()).calls[0]["id"] == "2"

    def test_custom_messages_key(self) -> None:
        parsed = tc.parse_input({"history": [ai(tool_call("add", "1"))]}, messages_key="history")
        assert parsed.kind == "state" and len(parsed.calls) == 1

    def test_tool_call_list_and_single_call(self) -> None:
        calls = [tool_call("add", "1"), {"name": "add", "args": {}, "id": "2"}]
        assert tc.parse_input(calls).kind == "tool_calls"
        assert tc.parse_input(tool_call("add", "3")).calls[0]["id"] == "3"

    def test_send_payload_carries_its_state(self) -> None:
        payload = {"__type": "tool_call_with_context", "tool_call": tool_call("add", "s"),
                   "state": {"messages": [], "k": 1}}
        parsed = tc.parse_input(payload)
        assert (parsed.kind, parsed.state["k"], parsed.calls[0]["id"]) == ("tool_calls", 1, "s")

    def test_message_dicts_are_converted(self) -> None:
        parsed = tc.parse_input([{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "",
                                  "tool_calls": [{"name": "add", "args": {"a": 1}, "id": "9"}]}])
        assert [c["id"] for c in parsed.calls] == ["9"]

    @pytest.mark.parametrize("value", [[], [HumanMessage("hi")], AIMessage("no calls"),
                                       {"messages": []}])
    def test_no_tool_calls_is_empty_not_an_error(self, value: Any) -> None:
        assert tc.parse_input(value).calls == []

    @pytest.mark.parametrize("value", [42, "text", {"foo": 1}, None])
    def test_unusable_input_is_a_typed_error(self, value: Any) -> None:
        with pytest.raises(ToolCallError, match="AIMessage|messages"):
            tc.parse_input(value)


class TestPrepareCalls:
    def test_good_calls(self) -> None:
        calls = tc.prepare_calls([tool_call("add", "1", a=1, b=2)], TOOLS)
        assert calls[0].problem is None and calls[0].tool is add
        assert calls[0].args == {"a": 1, "b": 2}

    def test_unknown_tool_names_the_available_ones(self) -> None:
        (call,) = tc.prepare_calls([tool_call("mul", "1")], TOOLS)
        assert isinstance(call.problem, ToolCallError)
        assert "'mul'" in str(call.problem) and "add, stateful" in str(call.problem)

    def test_json_string_args_are_decoded(self) -> None:
        (call,) = tc.prepare_calls([{"name": "add", "args": '{"a": 1, "b": 2}', "id": "1"}], TOOLS)
        assert call.problem is None and call.args == {"a": 1, "b": 2}

    @pytest.mark.parametrize("args,fragment", [([1, 2], "got list"), ("[1]", "got list"),
                                               ("{oops", "not valid JSON"), (7, "got int")])
    def test_args_that_are_not_an_object(self, args: Any, fragment: str) -> None:
        (call,) = tc.prepare_calls([{"name": "add", "args": args, "id": "1"}], TOOLS)
        assert isinstance(call.problem, ToolCallError) and fragment in str(call.problem)

    def test_missing_args_mean_no_args(self) -> None:
        (call,) = tc.prepare_calls([{"name": "add", "id": "1"}], TOOLS)
        assert call.problem is None and call.args == {}

    def test_duplicate_ids_run_once(self) -> None:
        calls = tc.prepare_calls([tool_call("add", "x"), tool_call("add", "y"),
                                  tool_call("add", "x")], TOOLS)
        assert [c.problem is None for c in calls] == [True, True, False]
        assert "#0 and #2" in str(calls[2].problem)

    def test_missing_id_and_name(self) -> None:
        calls = tc.prepare_calls([{"name": "add", "args": {}}, {"args": {}}, "junk"], TOOLS)
        assert calls[0].id == "add-0" and calls[0].problem is None
        assert "no tool name" in str(calls[1].problem)
        assert "not a dict" in str(calls[2].problem)


class TestInjection:
    def test_spec_finds_every_kind(self) -> None:
        spec = tc.injection_spec(stateful)
        assert spec.state == {"whole": None, "msgs": "messages", "extra": "extra"}
        assert spec.optional_state == {"extra"}
        assert spec.store == "store"
        assert {"whole", "msgs", "extra", "store", "call_id"} <= spec.hidden
        assert tc.injection_spec(with_runtime).runtime == "runtime"
        assert tc.injection_spec(add) is tc.NO_INJECTION

    def test_inject_from_state_dict_drops_forged_values(self) -> None:
        spec = tc.injection_spec(stateful)
        state = {"messages": ["m"], "extra": "e"}
        args = tc.inject_args({"x": 1, "whole": "forged", "call_id": "forged"}, spec,
                              tool_name="stateful", state=state, messages_key="messages",
                              store="STORE", runtime_factory=None)
        assert args == {"x": 1, "whole": state, "msgs": ["m"], "extra": "e", "store": "STORE"}

    def test_message_list_state_is_wrapped(self) -> None:
        spec = tc.InjectionSpec({"msgs": "messages"}, frozenset(), None, None, frozenset({"msgs"}))
        args = tc.inject_args({}, spec, tool_name="t", state=["m"], messages_key="messages",
                              store=None, runtime_factory=None)
        assert args == {"msgs": ["m"]}

    def test_missing_state_store_and_fields_are_clear_errors(self) -> None:
        spec = tc.injection_spec(stateful)
        with pytest.raises(ToolCallError, match="needs graph state"):
            tc.inject_args({}, spec, tool_name="stateful", state=None, messages_key="messages",
                           store="s", runtime_factory=None)
        with pytest.raises(ToolCallError, match="needs a store"):
            tc.inject_args({}, spec, tool_name="stateful", state={"messages": []},
                           messages_key="messages", store=None, runtime_factory=None)
        with pytest.raises(ToolCallError, match="needs state fields extra"):
            tc.inject_args({}, spec, tool_name="stateful", state=[], messages_key="messages",
                           store="s", runtime_factory=None)
        plain = tc.InjectionSpec({"v": "needed"}, frozenset(), None, None, frozenset({"v"}))
        with pytest.raises(ToolCallError, match="'needed'"):
            tc.inject_args({}, plain, tool_name="t", state={"messages": []},
                           messages_key="messages", store=None, runtime_factory=None)


class TestOutputs:
    def test_content_of(self) -> None:
        assert tc.content_of("s") == "s"
        assert tc.content_of({"a": 1}) == '{"a": 1}'
        assert tc.content_of([{"type": "text", "text": "t"}]) == [{"type": "text", "text": "t"}]
        assert tc.content_of(object()).startswith("<object object")

    def test_combine_plain_messages(self) -> None:
        messages = [ToolMessage("a", tool_call_id="1"), ToolMessage("b", tool_call_id="2")]
        assert tc.combine_outputs(messages, "messages", "messages") == messages
        assert tc.combine_outputs(messages, "state", "messages") == {"messages": messages}

    def test_combine_with_commands(self) -> None:
        message = ToolMessage("a", tool_call_id="1")
        command = Command(update={"foo": 1})
        send_a = Command(graph=Command.PARENT, goto=[Send("n", 1)])
        send_b = Command(graph=Command.PARENT, goto=[Send("n", 2)])
        out = tc.combine_outputs([message, command, send_a, send_b], "state", "messages")
        assert out[0] == {"messages": [message]} and out[1] is command
        assert out[2].goto == [Send("n", 1), Send("n", 2)] and len(out) == 3

    def test_check_command_requires_a_matching_tool_message(self) -> None:
        call = tc.PreparedCall(0, "id1", "t", {}, None)
        good = Command(update={"messages": [ToolMessage("ok", tool_call_id="id1")]})
        checked = tc.check_command(good, call, "messages")
        assert checked.update["messages"][0].name == "t"
        with pytest.raises(ToolCallError, match="no ToolMessage"):
            tc.check_command(Command(update={"messages": [HumanMessage("x")]}), call, "messages")
        assert tc.check_command(Command(goto="x"), call, "messages").goto == "x"
