"""The scripted chat model of the timeline tests: reports what AscendChatModel reports (usage
with cache reads, engine timings, speculation figures). Imported by file name (unique in the
test tree) from tests/observe."""

from __future__ import annotations

import time
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult


def reply(calls: list[dict[str, Any]], *, input_tokens: int, cached: int, output_tokens: int,
          speculative: dict[str, int] | None = None) -> AIMessage:
    """An AIMessage with AscendChatModel's usage and timing metadata."""
    metadata: dict[str, Any] = {
        "model_name": "scripted", "model_provider": "ascend",
        "finish_reason": "tool_calls" if calls else "stop",
        "timings": {"queue": 0.002, "time_to_first_token": 0.008, "decode": 0.010},
    }
    if speculative is not None:
        metadata["speculative"] = speculative
    return AIMessage(
        "" if calls else "done", tool_calls=calls,
        usage_metadata={"input_tokens": input_tokens, "output_tokens": output_tokens,
                        "total_tokens": input_tokens + output_tokens,
                        "input_token_details": {"cache_read": cached}},
        response_metadata=metadata)


class HopScriptedModel(BaseChatModel):
    """First hop (last message human): asks for the four tools; later hops answer. Stateless,
    so concurrent runs (``batch``) each get their own script; sleeps so hops have a length."""

    hop_s: float = 0.02

    @property
    def _llm_type(self) -> str:
        return "hop-scripted"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        time.sleep(self.hop_s)
        if isinstance(messages[-1], HumanMessage):
            calls = [{"name": name, "args": {"x": i}, "id": f"call-{name}", "type": "tool_call"}
                     for i, name in enumerate(("slow", "flaky", "broken", "hang"))]
            message = reply(calls, input_tokens=120, cached=0, output_tokens=30)
        else:
            message = reply([], input_tokens=200, cached=112, output_tokens=12,
                            speculative={"draft_tokens": 8, "accepted_tokens": 6,
                                         "forced_tokens": 2, "forward_passes": 4})
        return ChatResult(generations=[ChatGeneration(message=message)])
