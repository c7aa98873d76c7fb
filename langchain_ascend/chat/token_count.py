"""Token counts with the model's own tokenizer and chat template (never LangChain's GPT-2
fallback, which needs the hub).

:func:`count_prompt_tokens` renders the conversation exactly as a call does
(:func:`~langchain_ascend.chat.prepare.build_prompt`: template, tools or the fallback tool
format, template variables), so the count equals the call's ``usage_metadata["input_tokens"]``
for the same messages and bound tools. ``trim_messages(token_counter=llm)`` counts slices of a
conversation, so the count is lenient where a call is strict: an empty list is 0 and a
``ToolMessage`` whose call was trimmed away is rendered as it is. A slice the chat template
itself refuses (templates that demand alternating roles or a leading user turn) is counted as
the sum of its messages' text tokens, an estimate said so in the log.

``trim_messages(include_system=True)`` adds the system message's count to the rest's; a
template that gives a conversation without a system turn a default one (Qwen2.5's, SmolLM2's)
makes that sum larger than the whole, so such trimming keeps a little less than it could
(never more than ``max_tokens``). No torch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, convert_to_messages

from langchain_ascend.chat.prepare import ChatSettings, build_prompt, check_call_kwargs
from langchain_ascend.errors import ChatTemplateError

logger = logging.getLogger(__name__)


def text_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` as the prompt path tokenizes it (no special tokens added)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def _message_text(message: BaseMessage) -> str:
    content = message.content if isinstance(message.content, str) else json.dumps(
        message.content, default=str)
    if isinstance(message, AIMessage) and message.tool_calls:
        content += json.dumps([{"name": c["name"], "arguments": c["args"]}
                               for c in message.tool_calls], default=str)
    return content


def count_prompt_tokens(
    messages: Sequence[BaseMessage],
    kwargs: Mapping[str, Any],
    settings: ChatSettings,
    tokenizer_holder_for: Callable[[str], Any],
) -> int:
    """Prompt tokens of a call with ``messages`` and call arguments ``kwargs`` (``tools``,
    ``tool_choice``, ``chat_template_kwargs``...).

    Args:
        messages: The conversation (or a slice of one), as ``invoke`` takes it
            (``BaseMessage`` objects, ``("user", "hi")`` tuples, dicts, strings).
        kwargs: The call's arguments, as ``invoke`` / ``bind_tools`` would pass them.
        settings: The chat model's settings.
        tokenizer_holder_for: Returns an object with the model's ``tokenizer`` (its engine,
            or the tokenizer alone).

    Raises:
        InvalidRequestError, UnsupportedContentError: As a call would (an unknown argument,
            image blocks...).
    """
    check_call_kwargs(kwargs)
    messages = convert_to_messages(messages)
    if not messages:
        return 0
    try:
        prompt = build_prompt(messages, kwargs, settings, tokenizer_holder_for, strict=False)
    except ChatTemplateError as error:
        if "rejected the conversation" not in str(error):  # no template, unusable tools
            raise
        logger.info("the chat template refuses this slice of %d messages (%s); counting "
                    "their text tokens instead", len(messages), error)
        holder = tokenizer_holder_for(kwargs.get("model") or settings.model)
        return sum(len(text_token_ids(holder.tokenizer, _message_text(m))) for m in messages)
    return len(prompt.token_ids)
