"""A chat template the caller gives (``AscendChatModel(chat_template=...)``, the config's
``model.chat_template``), for models whose tokenizer has none (base models, GGUF files without
``tokenizer.chat_template``) or whose template should be replaced.

No torch. :func:`load_chat_template` reads the argument: a Jinja string, or the path of a file
holding one; it is checked when the chat model is built. :func:`with_chat_template` gives a
view of the engine's tokenizer that renders with that template: the engine's tokenizer itself
is never changed, so chat models sharing one engine (same weights, same KV cache) each keep
their own template, and nothing one of them sets leaks into another's requests.
:func:`template_stop_token_ids` names the end-of-turn tokens such a template writes
(``<|im_end|>``...): a base model's generation config does not stop there, so each request
of that template does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from langchain_ascend.engine.hf_config import end_of_turn_token_ids
from langchain_ascend.errors import ChatTemplateError, InvalidArgumentTypeError

#: Text that only a Jinja template holds: a statement or an expression tag.
JINJA_MARKERS = ("{%", "{{")
#: File name endings of template files (a value ending so is read as a path).
TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2", ".tmpl", ".template", ".txt")
#: Where the advice on a missing template points.
HOW_TO_SET = ("pass chat_template= (a Jinja string or file) to AscendChatModel, or "
              "model.chat_template in the config")


def is_jinja(text: str) -> bool:
    """True when ``text`` holds a Jinja tag (``{% ... %}`` or ``{{ ... }}``)."""
    return any(marker in text for marker in JINJA_MARKERS)


def _looks_like_path(text: str) -> bool:
    """One line naming a file: a separator, ``~`` / ``.`` in front, or a template suffix."""
    if not text.strip() or "\n" in text:
        return False
    return ("/" in text or "\\" in text or os.sep in text or text.startswith(("~", "."))
            or text.lower().endswith(TEMPLATE_SUFFIXES))


def load_chat_template(value: Any) -> str | None:
    """The Jinja source ``chat_template=`` stands for (None for None).

    A string holding ``{%`` or ``{{`` is the template itself; any other string, or an
    ``os.PathLike``, is the path of a file holding one (``~`` expanded).

    Raises:
        InvalidArgumentTypeError: ``value`` is neither a string nor a path.
        ChatTemplateError: No file at that path (or a folder there), a file that is not UTF-8
            text or holds no Jinja tag, a string that is neither a template nor a file, or a
            template Jinja cannot parse; the message names ``chat_template=``.
    """
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        return _read_file(Path(os.fspath(value)), value)
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(
            f"chat_template= must be a Jinja template string or the path of a file holding "
            f"one, got {type(value).__name__} {value!r:.60}")
    if is_jinja(value):
        _check_syntax(value, "the chat_template= string")
        return value
    path = Path(value).expanduser()
    if _is_file(path):
        return _read_file(path, value)
    if _is_dir(path):
        raise ChatTemplateError(
            f"chat_template={value!r} is a folder; pass the template file inside it "
            "(e.g. chat_template.jinja) or the Jinja string itself")
    if _looks_like_path(value):
        raise ChatTemplateError(
            f"chat_template={value!r} looks like a file path, but there is no file at "
            f"{path}; pass chat_template= the path of an existing file holding a Jinja chat "
            "template, or the template string itself")
    raise ChatTemplateError(
        f"chat_template={value!r:.80} is neither a Jinja template (it has no {{% or {{{{ "
        "tag) nor the path of an existing file; pass the template text or a file holding "
        "it (template names such as 'chatml' are not supported)")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL in it
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _read_file(path: Path, given: Any) -> str:
    """The template in the file at ``path`` (named ``given`` by the caller)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChatTemplateError(
            f"chat_template={os.fspath(given)!r}: there is no file at {path}; pass the path "
            "of an existing file holding a Jinja chat template, or the template string "
            "itself") from None
    except IsADirectoryError:
        raise ChatTemplateError(
            f"chat_template={os.fspath(given)!r} is a folder; pass the template file inside "
            "it (e.g. chat_template.jinja)") from None
    except UnicodeDecodeError as exc:
        raise ChatTemplateError(
            f"chat_template={os.fspath(given)!r}: {path} is not UTF-8 text ({exc.reason} at "
            f"byte {exc.start}); expected a Jinja chat template file") from None
    except OSError as exc:
        raise ChatTemplateError(
            f"chat_template={os.fspath(given)!r}: cannot read {path} ({exc.strerror or exc})"
        ) from None
    if not is_jinja(text):
        raise ChatTemplateError(
            f"chat_template={os.fspath(given)!r}: {path} holds no Jinja template (no {{% or "
            "{{ tag); expected a chat template such as a tokenizer's chat_template.jinja")
    _check_syntax(text, f"the file {path}")
    return text


def _check_syntax(text: str, origin: str) -> None:
    """Compile ``text`` as transformers will render it, so a broken template fails when the
    chat model is built rather than on its first call."""
    import jinja2

    try:
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template
        except ImportError:  # moved in another transformers version: jinja2's parser alone
            import jinja2.ext
            import jinja2.sandbox

            jinja2.sandbox.ImmutableSandboxedEnvironment(
                extensions=[jinja2.ext.loopcontrols]).parse(text)
        else:
            _compile_jinja_template(text)
    except jinja2.TemplateError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ChatTemplateError(
            f"chat_template=: {origin} is not a valid Jinja template{where}: {exc}") from exc


class TemplatedTokenizer:
    """The engine's tokenizer seen through another chat template.

    ``chat_template`` is the given template and ``apply_chat_template`` renders with it (as
    transformers' ``apply_chat_template(chat_template=...)``); every other attribute is the
    tokenizer's own. The tokenizer is not modified.

    Args:
        tokenizer: The engine's (shared) tokenizer.
        chat_template: The Jinja source to render with.
    """

    __slots__ = ("_tokenizer", "chat_template")

    def __init__(self, tokenizer: Any, chat_template: str) -> None:
        self._tokenizer = tokenizer
        self.chat_template = chat_template

    @property
    def tokenizer(self) -> Any:
        """The tokenizer this view is over."""
        return self._tokenizer

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        """The tokenizer's ``apply_chat_template`` with this view's template."""
        kwargs["chat_template"] = self.chat_template
        return self._tokenizer.apply_chat_template(conversation, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __repr__(self) -> str:
        return f"TemplatedTokenizer({self._tokenizer!r}, chat_template=<{len(self.chat_template)} chars>)"


def with_chat_template(tokenizer: Any, chat_template: str | None) -> Any:
    """``tokenizer`` rendering with ``chat_template`` (a :class:`TemplatedTokenizer`), or
    ``tokenizer`` itself when ``chat_template`` is None."""
    if chat_template is None:
        return tokenizer
    return TemplatedTokenizer(tokenizer, chat_template)


def template_stop_token_ids(tokenizer: Any, chat_template: str | None) -> list[int]:
    """End-of-turn tokens (``<|im_end|>``, ``<|eot_id|>``...) that ``chat_template`` writes and
    the tokenizer has as one token: a reply of that template ends there even where the
    model's own EOS is another token (a base model's ``<|endoftext|>``). Empty for None."""
    if not chat_template:
        return []
    return end_of_turn_token_ids(chat_template, tokenizer)
