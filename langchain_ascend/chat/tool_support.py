"""Does the chat template render tools? If not, render them (and the tool history) ourselves.

Pure (no torch). :func:`template_renders_tools` renders a probe tool through the template and
looks for it in the text (cached per template source). :func:`resolve_tool_support` combines
that with the ``tool_call_format`` setting into a :class:`ToolSupport`: the format to parse and
force, and whether the fallback (the Hermes format's own prompt rendering,
:mod:`~langchain_ascend.tool_formats.hermes`) is used. It logs
the path once (INFO) per model and template. :func:`apply_fallback` rewrites template messages
for the fallback: tool schemas into the system turn, earlier calls into the assistant's text,
tool results into ``user`` turns of ``<tool_response>`` blocks.

``tool_call_format`` settings:

* ``"auto"`` — probe the template: native rendering with the format its markers suggest, else
  the fallback (Hermes ``<tool_call>``);
* ``"fallback"`` — always the fallback, even for a template that renders tools;
* ``"hermes"`` — that syntax; a template that cannot render tools gets the fallback (which is
  Hermes);
* ``"llama3_json"`` / ``"mistral"`` — the template must render tools itself: with tools bound
  and a template that ignores them this is a :class:`~langchain_ascend.errors.ChatTemplateError`
  (nothing would tell the model about the tools or that syntax).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_ascend.errors import ChatTemplateError
from langchain_ascend.tool_formats import ToolCallFormat, detect_tool_call_format
from langchain_ascend.tool_formats.hermes import HERMES

logger = logging.getLogger(__name__)

ToolCallFormatSetting = Literal["auto", "fallback", "hermes", "llama3_json", "mistral"]
FALLBACK = HERMES  # the format that can write tools into a prompt itself
FALLBACK_FORMAT: ToolCallFormat = "hermes"

PROBE_TOOL_NAME = "zq_probe_lookup_7319"
PROBE_TOOL_DESCRIPTION = "Probe description qv4k8 used to test tool rendering."
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL_NAME,
        "description": PROBE_TOOL_DESCRIPTION,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
_PROBE_CONVERSATIONS: tuple[list[dict[str, str]], ...] = (
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
)

_RENDERS_TOOLS: dict[str, bool] = {}
_LOGGED: set[tuple[str, str, str]] = set()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ToolSupport:
    """How one model's requests carry tools.

    Attributes:
        fmt: Tool-call syntax to parse (and, when not ``"auto"``, to force).
        fallback: The tools and the tool history are rendered by :func:`apply_fallback` in the
            fallback format, not by the template.
        template_renders_tools: What :func:`template_renders_tools` found.
    """

    fmt: ToolCallFormat
    fallback: bool
    template_renders_tools: bool

    @property
    def usable(self) -> bool:
        """Bound tools reach the model (through the template or the fallback)."""
        return self.fallback or self.template_renders_tools


def _template_source(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return template
    if isinstance(template, Mapping):  # named templates: the "default" one renders chats
        default = template.get("default")
        return default if isinstance(default, str) else None
    return None


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows ``tools`` to the model.

    Renders a probe tool with a distinctive name and description and checks that either
    appears in the text; a template that raises on tools counts as not rendering them. The
    answer is cached per template source.
    """
    source = _template_source(tokenizer)
    if not source:
        return False
    with _LOCK:
        cached = _RENDERS_TOOLS.get(source)
    if cached is not None:
        return cached
    renders = False
    for conversation in _PROBE_CONVERSATIONS:
        try:
            text = tokenizer.apply_chat_template(
                conversation, tools=[_PROBE_TOOL], add_generation_prompt=True, tokenize=False
            )
        except Exception:  # jinja2 errors, raise_exception() in templates
            continue
        renders = isinstance(text, str) and (
            PROBE_TOOL_NAME in text or PROBE_TOOL_DESCRIPTION in text
        )
        break
    with _LOCK:
        _RENDERS_TOOLS[source] = renders
    return renders


def resolve_tool_support(
    tokenizer: Any, setting: ToolCallFormatSetting, *, model_name: str = ""
) -> ToolSupport:
    """The tool path for this tokenizer's template under ``setting`` (see the module docs).

    Logs the path once per model and template at INFO. Never raises: whether an explicit
    format that needs the template can work is checked by :func:`check_tools_usable` when
    tools are actually bound.
    """
    source = _template_source(tokenizer)
    native = template_renders_tools(tokenizer)
    if setting == "fallback" or (not native and setting in ("auto", FALLBACK_FORMAT)):
        support = ToolSupport(FALLBACK_FORMAT, True, native)
    elif setting == "auto":
        support = ToolSupport(detect_tool_call_format(source), False, native)
    else:
        support = ToolSupport(setting, False, native)
    _log_once(model_name or str(getattr(tokenizer, "name_or_path", "")), source, setting, support)
    return support


def check_tools_usable(support: ToolSupport, setting: str, *, model_name: str) -> None:
    """Raise when tools are bound but nothing would show them to the model.

    Raises:
        ChatTemplateError: The template ignores ``tools`` and ``setting`` names a format
            (``llama3_json``, ``mistral``) the fallback does not speak.
    """
    if support.usable:
        return
    name = model_name or "this model"
    raise ChatTemplateError(
        f"the chat template of {name!r} does not render tools, and tool_call_format="
        f"{setting!r} cannot be used without it: use tool_call_format='auto' (or 'hermes' / "
        f"'fallback') to have the tools written into the system turn in the {FALLBACK.opener} "
        "format"
    )


def _log_once(model: str, source: str | None, setting: str, support: ToolSupport) -> None:
    digest = hashlib.sha256((source or "").encode()).hexdigest()[:12]
    key = (model, digest, setting)
    with _LOCK:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    if support.fallback:
        logger.info(
            "%s: chat template %s does not render tools (tool_call_format=%r); tool schemas "
            "and tool history are written into the prompt in the %s fallback format",
            model, digest, setting, FALLBACK.opener,
        )
    else:
        logger.info(
            "%s: chat template %s renders tools itself; tool calls parsed as %r "
            "(tool_call_format=%r)",
            model, digest, support.fmt, setting,
        )


def apply_fallback(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """Template messages rewritten for a template that knows nothing about tools.

    * With ``tools``, their section (:meth:`~langchain_ascend.tool_formats.hermes.
      HermesFormat.render_tools_section`) is prepended to the first message when it is a
      system message, else a system message holding it is added in front. The user's system
      prompt stays last, next to the conversation: SmolLM2 follows it there (put first, the
      demo agent's model echoed the section's last line instead of answering), and putting the
      section's instructions before its schemas cost it 1.5-4 points of argument accuracy in
      ``benchmarks/bench_new_tools.py``'s cases, so a new tool set recomputes the system turn.
    * An assistant message's ``tool_calls`` are appended to its content in the fallback format
      (and the key dropped).
    * Consecutive ``tool`` messages become one ``user`` message of ``<tool_response>`` blocks,
      each with the tool name and call id.

    The input is not modified.
    """
    rewritten: list[dict[str, Any]] = []
    for message in messages:
        entry = dict(message)
        if entry.get("role") == "assistant" and entry.get("tool_calls"):
            calls = FALLBACK.render_calls(entry.pop("tool_calls"))
            entry["content"] = "\n".join(p for p in (entry.get("content") or "", calls) if p)
        elif entry.get("role") == "tool":
            block = FALLBACK.render_tool_response(
                entry.get("name"), entry.get("tool_call_id"), str(entry.get("content") or "")
            )
            previous = rewritten[-1] if rewritten else None
            if previous is not None and previous.get("_tool_results"):
                previous["content"] += "\n" + block
                continue
            entry = {"role": "user", "content": block, "_tool_results": True}
        rewritten.append(entry)
    for entry in rewritten:
        entry.pop("_tool_results", None)
    if tools:
        section = FALLBACK.render_tools_section(tools)
        if rewritten and rewritten[0].get("role") == "system":
            first = rewritten[0]
            first["content"] = "\n\n".join(p for p in (section, first.get("content") or "") if p)
        else:
            rewritten.insert(0, {"role": "system", "content": section})
    return rewritten
