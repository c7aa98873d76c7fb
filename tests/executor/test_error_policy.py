"""``handle_tool_errors`` resolved into an ErrorPolicy, as langgraph's ToolNode reads it."""

from __future__ import annotations

from typing import Union

import pytest

from langchain_ascend.errors import InvalidRequestError, ToolCallError, ToolTimeoutError
from langchain_ascend.executor import error_policy as ep


class TestErrorPolicy:
    def test_bool_flags(self) -> None:
        assert ep.error_policy(True).handles(ValueError())
        assert not ep.error_policy(False).handles(ValueError())

    def test_str_flag_replaces_the_text(self) -> None:
        policy = ep.error_policy("try later")
        assert policy.render(KeyError("k"), "t") == "try later"

    def test_types_limit_what_is_caught(self) -> None:
        policy = ep.error_policy((ValueError, TimeoutError))
        assert policy.handles(ValueError()) and policy.handles(ToolTimeoutError("t"))
        assert not policy.handles(KeyError())
        assert ep.error_policy(KeyError).handles(KeyError())

    def test_callable_types_come_from_its_annotation(self) -> None:
        def on_value(e: ValueError) -> str:
            return f"value: {e}"

        def on_either(e: Union[KeyError, TypeError]) -> str:  # noqa: UP007
            return "either"

        policy = ep.error_policy(on_value)
        assert policy.handles(ValueError("v")) and not policy.handles(KeyError())
        assert policy.render(ValueError("v"), "t") == "value: v"
        assert ep.error_policy(on_either).handled == (KeyError, TypeError)
        assert ep.error_policy(lambda e: "x").handled == (Exception,)

    def test_bad_flags_are_rejected(self) -> None:
        def wrong(e: int) -> str:
            return ""

        with pytest.raises(InvalidRequestError, match="annotates"):
            ep.error_policy(wrong)
        with pytest.raises(InvalidRequestError, match="handle_tool_errors"):
            ep.error_policy(3)

    def test_default_messages_tell_the_model_what_happened(self) -> None:
        assert "raised ValueError: bad" in ep.default_error_content(ValueError("bad"), "t")
        assert "Fix the tool call" in ep.default_error_content(ToolCallError("no"), "t")
