"""``AscendChatModel.profile``: what the model can do, as LangChain's ``ModelProfile`` says it
(``create_agent`` middleware and summarisation read ``max_input_tokens``).

Resolved when the chat model is built, from files only (nothing is loaded): the context length
the engine will use (``max_context_length`` when set, else the config's
``max_position_embeddings`` or the GGUF header's ``<arch>.context_length``, which the engine's
config is made from), and the chat template (``reasoning_output`` when it writes ``<think>``).
Tool calling, tool choice and structured output hold for every model (the fallback tool format
and grammar-constrained decoding). No torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langchain_core.language_models.model_profile import ModelProfile

from langchain_ascend.chat.model_names import readable_model_name
from langchain_ascend.engine.model_source import inspect_gguf

_REASONING_MARKERS = ("<think>", "enable_thinking", "reasoning_content")


def _gguf_file(path: Path, gguf_file: str | None) -> Path | None:
    """The GGUF file ``path`` names (a file, or a folder with ``gguf_file`` or only one)."""
    if path.is_file():
        return path
    if gguf_file is not None:
        return path / gguf_file
    ggufs = sorted(path.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 and not (path / "config.json").is_file() else None


def _snapshot(model: str) -> Path | None:
    """The cached Hugging Face snapshot of hub id ``model`` (never downloads)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or no hub package): nothing to read
        return None


def _folder_context(folder: Path) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def _folder_template(folder: Path) -> str:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")
                              ).get("chat_template")
    except (OSError, ValueError):
        return ""
    if isinstance(template, list):  # named templates: [{"name", "template"}]
        return "".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""


def model_facts(model: str, gguf_file: str | None = None) -> tuple[int | None, str]:
    """``(context length, chat template text)`` of a model from its files (``None`` / ``""``
    where they do not say, e.g. a hub id not in the local cache)."""
    path = Path(model).expanduser()
    if not path.exists():
        snapshot = _snapshot(model)
        if snapshot is None:
            return None, ""
        path = snapshot
    gguf = _gguf_file(path, gguf_file)
    if gguf is not None:
        values = inspect_gguf(gguf).values
        context = values.get(f"{values.get('general.architecture')}.context_length")
        template = values.get("tokenizer.chat_template")
        return (int(context) if isinstance(context, int) else None,
                template if isinstance(template, str) else "")
    return _folder_context(path), _folder_template(path)


def chat_model_profile(*, name: str, context_length: int | None,
                       chat_template: str) -> ModelProfile:
    """The profile of a chat model served by this package.

    Args:
        name: The model's readable name.
        context_length: Most tokens per request the engine allows (prompt + reply), if known.
        chat_template: The template the prompts render with ("" if unknown).
    """
    profile = ModelProfile(
        name=name, open_weights=True, text_inputs=True, image_inputs=False,
        audio_inputs=False, video_inputs=False, pdf_inputs=False, text_outputs=True,
        image_outputs=False, audio_outputs=False, video_outputs=False, tool_calling=True,
        tool_choice=True, tool_call_streaming=True, structured_output=True, temperature=True,
        reasoning_output=any(marker in chat_template for marker in _REASONING_MARKERS),
    )
    if context_length is not None:
        profile["max_input_tokens"] = context_length
        profile["max_output_tokens"] = context_length
    return profile


def profile_for(chat: Any, chat_template: str | None) -> ModelProfile:
    """The profile of chat model ``chat`` (``chat_template``: the text it was given, which
    replaces the model's own)."""
    context, template = model_facts(chat.model, chat.gguf_file)
    if chat.max_context_length is not None:  # the engine allows no more than the model's
        context = chat.max_context_length if context is None else min(
            context, chat.max_context_length)
    return chat_model_profile(name=readable_model_name(chat.model, chat.gguf_file),
                              context_length=context, chat_template=chat_template or template)
