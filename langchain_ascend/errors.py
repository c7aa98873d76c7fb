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


class EngineStepError(LangChainAscendError, RuntimeError):
    """A model step failed: the requests in that step were failed (the cause is chained as
    ``__cause__``); the engine keeps serving the others and new requests."""


class RequestFaultError(EngineStepError):
    """One request's own part of a model step failed (its grammar constraint, logits
    processing or sampling raised): that request alone was failed, the other requests of the
    step kept their tokens and went on. The message names the request and the callback, the
    cause is chained as ``__cause__``."""


class ToolCallError(LangChainAscendError, ValueError):
    """A tool call cannot be run as given: unknown tool name, arguments that are not a JSON
    object or fail the tool's schema, a missing name, or a ``tool_call_id`` used twice."""


class ToolTimeoutError(LangChainAscendError, TimeoutError):
    """A tool call ran past its ``timeout_ms``; the caller got its answer on time, and a sync
    tool's thread was left to finish on its own (threads cannot be killed)."""


class ToolWorkersExhaustedError(LangChainAscendError, RuntimeError):
    """Too many tool threads are stuck in calls that timed out earlier, so the executor refuses
    to start more until some of them return (see ``max_abandoned_threads``)."""


class UnsupportedContentError(InvalidRequestError):
    """A message carries content this model cannot read (an image, audio or file block...).

    The message names the block type and the position of the message in the conversation.
    """


class ForcedOutputError(LangChainAscendError, RuntimeError):
    """A forced tool call (``tool_choice="required"`` or a tool name) ended without a valid
    parsed call although it was not cut at ``max_tokens``: the reply is not what the grammar
    forced. The message carries the raw reply text; the request's resources are freed."""


class ChatTemplateError(LangChainAscendError, ValueError):
    """The tokenizer has no chat template, or its template rejected the conversation."""


class VectorStoreInputError(LangChainAscendError, ValueError):
    """Bad input to a vector store or an embedding model: mismatched lengths of texts, metadatas
    and ids, an id given twice in one call, no texts where at least one is needed, an unknown
    option. Nothing was changed: the store keeps its previous contents."""


class EmbeddingDimensionError(VectorStoreInputError):
    """A vector's width differs from the index's dimension; the message gives both."""


class InvalidVectorError(VectorStoreInputError):
    """A vector holds NaN or infinity, or is not a flat sequence of numbers; the message names
    the first offending row."""


class InvalidFilterError(VectorStoreInputError):
    """A metadata filter is malformed: an unknown ``$`` operator, ``$and``/``$or`` without a
    list, ``$in``/``$nin`` without a list, or a filter that is neither a dict nor a callable."""


class IndexFormatError(LangChainAscendError, ValueError):
    """A saved index folder cannot be read: files missing, truncated or corrupted, or written
    by a newer format version. The message names the file."""


class ChecksumMismatchError(IndexFormatError):
    """A file in a saved index folder does not match the checksum recorded when it was saved."""


class UnsafeDeserializationError(LangChainAscendError, ValueError):
    """Loading would unpickle a file (a ``langchain_community`` FAISS folder) and the caller did
    not pass ``allow_dangerous_deserialization=True``."""


class EmbeddingModelError(LangChainAscendError, ValueError):
    """The embedding model cannot be loaded (no such local folder and no cached hub copy) or
    returned something unusable; the message names the model."""


class ModelSourceError(LangChainAscendError, ValueError):
    """A model source cannot be used: the path is missing, a folder holds neither
    ``config.json`` nor GGUF files (or several GGUF files and none was picked), a GGUF file is
    corrupt, truncated or of an architecture transformers cannot load, a hub id is not in the
    local Hugging Face cache while offline, or de-quantizing a GGUF file failed. The message
    names the path or value and what was expected there."""


class InvalidArgumentTypeError(InvalidRequestError, TypeError):
    """An argument has the wrong type (``max_tokens=True``, ``top_k=2.7``, ``k="3"``, a tool
    that is not a tool, a sequence that is a bare string where a string would be a mistake).

    Derives from both ``ValueError`` (as every bad argument here) and ``TypeError`` (what
    Python raises for a wrong type), so either ``except`` catches it. The message names the
    argument, the value and what is allowed.
    """


class VectorStoreArgumentTypeError(VectorStoreInputError, TypeError):
    """A vector-store or embedding argument has the wrong type (``k="3"``, ``texts=None``,
    ``embed_documents("one text")``). A ``ValueError`` and a ``TypeError``; nothing was
    changed in the store."""


class InvalidTextError(InvalidRequestError, VectorStoreInputError):
    """A text cannot be encoded as UTF-8 (it holds a lone surrogate such as ``"\\ud800"``, as
    left by a bad decode); the message names the argument and the character position."""


class QuantizationError(LangChainAscendError, ValueError):
    """Weights cannot be quantized or multiplied in a quantized format as given: an unknown
    format, an input width that is not a multiple of the 32-weight block, a tensor of the
    wrong dtype or shape, or blocks whose size does not match the format. The message names
    the format, the shapes and what was expected."""


class UnsupportedModelFeatureError(LangChainAscendError, ValueError):
    """The model needs something the chosen engine path does not run (Gemma 2's attention
    logit soft-capping under an attention backend whose device kernel has none), found when
    the engine starts. The message names the model, the config field and what to use
    instead."""


class MissingExtraError(LangChainAscendError, ImportError):
    """An optional part of the package is used without the extra that installs it (the PNG
    chart without matplotlib...). The message names the feature, the missing module and the
    command that installs it: ``pip install 'langchain-ascend[<extra>]'``."""
