"""Typed errors raised by langchain-ascend.

Every error a user can trigger with bad input or a missing device derives from
:class:`LangChainAscendError`, so one ``except`` catches them all, and each subclass also
derives from the built-in exception a caller would naturally expect (``ValueError`` for bad
arguments, ``RuntimeError`` for a missing device).
"""

from __future__ import annotations


class LangChainAscendError(Exception):
    """Base class of every error raised on purpose by this package."""


class DeviceUnavailableError(LangChainAscendError, RuntimeError):
    """An explicitly requested device (``"npu"``, ``"cuda:1"``...) cannot be used.

    The message says what is missing: the torch_npu package, the CANN libraries, or a device.
    """


class InvalidRequestError(LangChainAscendError, ValueError):
    """A generation request is malformed (empty prompt, ``max_tokens <= 0``...)."""


class PromptTooLongError(InvalidRequestError):
    """The prompt does not fit ``max_context_length`` or the whole KV-cache pool."""


class EngineClosedError(LangChainAscendError, RuntimeError):
    """The engine was shut down, or its background loop died; the message carries the cause."""


class RequestAbortedError(LangChainAscendError, RuntimeError):
    """A request was aborted (cancelled by its caller) before it finished."""
