"""A GGUF file's tokenizer, built from its own metadata with the ``tokenizers`` library.

``AutoTokenizer.from_pretrained(folder, gguf_file=...)`` first rebuilds the model's whole
config through ``gguf.GGUFReader``, which decodes every metadata array into numpy views: about
15 s of CPU for SmolLM2's 49k-token vocabulary, the largest part of a GGUF file's first use.
This module reads the vocabulary, merges, token types, special token ids, flags and chat
template with the package's reader (:class:`~langchain_ascend.quant.gguf_file.GGUFFile`, whose
header was parsed once for the file and is shared; the arrays decoded from its map in tenths of
a second) and builds the same tokenizer transformers builds for a byte-level BPE vocabulary
(``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen 2/3, SmolLM...):

- the vocabulary as the file spells it, a token that is not written in GPT-2's byte alphabet
  re-spelled byte by byte in it; the file's merges; a ``BPE`` model without unknown token;
- a byte-level pre-tokenizer: GPT-2's split regex, or, for a ``tokenizer.ggml.pre`` that
  transformers knows a split regex for (``GGUF_PRE_TOKENIZER_SPLITS``, read from transformers
  so both always agree), that regex followed by a byte-level step without its own regex;
  a byte-level decoder;
- tokens typed CONTROL (3) added as special tokens (skipped when not written in the byte
  alphabet: a llama.cpp mislabel), tokens typed USER_DEFINED (4) found in the vocabulary added
  as plain added tokens, both matched whole;
- ``bos``/``eos``/``unk``/``pad`` tokens from the ``tokenizer.ggml.*_token_id`` keys,
  ``add_bos_token``/``add_eos_token`` from the file's flags, the chat template.

Other vocabularies (SentencePiece ``llama``, ``t5``, Gemma's...) go through transformers as
before (:func:`transformers_gguf_tokenizer`). ``integration_tests/test_gguf_tokenizer_smollm2.py``
and ``tests/quant/test_gguf_tokenizer.py`` check the ids, decoded text, special tokens and
chat template against transformers' own build.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from langchain_ascend.quant.gguf_file import GGUFFile

BYTE_LEVEL_MODEL = "gpt2"
"""``tokenizer.ggml.model`` of a byte-level BPE vocabulary (the one built here)."""
CONTROL, USER_DEFINED = 3, 4
"""llama.cpp's token types of special tokens and of plain added tokens."""
SPECIAL_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}
"""transformers' special token name -> the ``tokenizer.ggml.<key>`` holding its id."""


@dataclasses.dataclass(frozen=True)
class GGUFVocab:
    """What a GGUF file says about its tokenizer.

    Attributes:
        model: ``tokenizer.ggml.model`` (``"gpt2"``, ``"llama"``...).
        pre: ``tokenizer.ggml.pre`` (``"qwen2"``, ``"llama-bpe"``, ``"smollm"``...), or None.
        tokens: The vocabulary, by id.
        token_types: llama.cpp's type of each token (1 normal, 3 control, 4 user-defined...);
            empty when the file has none.
        merges: ``"left right"`` merge rules, best first.
        special_tokens: ``{"bos_token": "<|im_start|>", ...}`` for the ids the file names.
        add_bos_token: ``tokenizer.ggml.add_bos_token``, or None when absent.
        add_eos_token: ``tokenizer.ggml.add_eos_token``, or None when absent.
        chat_template: ``tokenizer.chat_template``, or None.
    """

    model: str
    pre: str | None
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special_tokens: dict[str, str]
    add_bos_token: bool | None
    add_eos_token: bool | None
    chat_template: str | None


def read_vocab(gguf: GGUFFile) -> GGUFVocab:
    """The tokenizer metadata of ``gguf`` (its arrays decoded; no tensor is read).

    Raises:
        KeyError: The file has no ``tokenizer.ggml.tokens``.
    """
    metadata = gguf.metadata
    tokens = [str(token) for token in gguf.array("tokenizer.ggml.tokens")]

    def optional_array(key: str) -> list[Any]:
        return gguf.array(key) if key in metadata else []

    special = {}
    for name, key in SPECIAL_KEYS.items():
        index = metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and 0 <= index < len(tokens):
            special[name] = tokens[index]

    def flag(key: str) -> bool | None:
        value = metadata.get(f"tokenizer.ggml.{key}")
        return bool(value) if isinstance(value, bool) else None

    pre = metadata.get("tokenizer.ggml.pre")
    template = metadata.get("tokenizer.chat_template")
    return GGUFVocab(
        model=str(metadata.get("tokenizer.ggml.model", "")),
        pre=pre if isinstance(pre, str) else None, tokens=tokens,
        token_types=[int(kind) for kind in optional_array("tokenizer.ggml.token_type")],
        merges=[str(merge) for merge in optional_array("tokenizer.ggml.merges")],
        special_tokens=special, add_bos_token=flag("add_bos_token"),
        add_eos_token=flag("add_eos_token"),
        chat_template=template if isinstance(template, str) else None)


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's spelling of each byte as one printable character: the printable Latin-1 bytes
    (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves, every other byte for the
    next unused code point from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    spelling = {byte: chr(byte) for byte in printable}
    extra = 256
    for byte in range(256):
        if byte not in spelling:
            spelling[byte] = chr(extra)
            extra += 1
    return spelling


def spelled_vocab(tokens: list[str]) -> dict[str, int]:
    """Token -> id, a token not written in the byte alphabet re-spelled from its UTF-8 bytes
    (llama.cpp stores a few added tokens as plain text)."""
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if not set(token) <= alphabet:
            token = "".join(spelling[byte] for byte in token.encode("utf-8"))
        vocab[token] = index
    return vocab


def split_regex(pre: str | None) -> str | None:
    """The split regex transformers uses for ``tokenizer.ggml.pre`` (None: GPT-2's own).

    Raises:
        ImportError: This transformers has no table of them (use transformers' own build).
    """
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_PRE_TOKENIZER_SPLITS,
    )

    found = GGUF_PRE_TOKENIZER_SPLITS.get(pre) if pre is not None else None
    return found if isinstance(found, str) else None


def byte_level_backend(vocab: GGUFVocab, split: str | None) -> Any:
    """The ``tokenizers.Tokenizer`` of a byte-level BPE vocabulary, without its added tokens
    (module docstring). ``split`` is the pre-tokenizer's regex, None for GPT-2's."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(merge.split(" ")) for merge in vocab.merges]
    backend = Tokenizer(models.BPE(vocab=spelled_vocab(vocab.tokens), merges=merges,
                                   dropout=None, unk_token=None, continuing_subword_prefix="",
                                   end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def added_tokens(vocab: GGUFVocab, known: dict[str, int]) -> tuple[list[Any], list[Any]]:
    """``(special, plain)`` ``AddedToken`` lists: CONTROL tokens written in the byte alphabet,
    USER_DEFINED tokens found in ``known`` (the tokenizer's vocabulary)."""
    from tokenizers import AddedToken

    alphabet = set(byte_alphabet().values())
    special, plain = [], []
    for token, kind in zip(vocab.tokens, vocab.token_types, strict=False):  # types may be absent
        if kind == CONTROL and set(token) <= alphabet:
            special.append(AddedToken(token, normalized=False, special=True))
        elif kind == USER_DEFINED and token in known:
            plain.append(AddedToken(token, normalized=False, special=False))
    return special, plain


def build_byte_level_tokenizer(vocab: GGUFVocab, split: str | None) -> Any:
    """The transformers fast tokenizer of a byte-level vocabulary (module docstring).

    The added tokens go into the ``tokenizers`` object itself, as transformers' GGUF route
    leaves them: the wrapper's own special tokens are the four the file names by id."""
    from transformers import PreTrainedTokenizerFast

    backend = byte_level_backend(vocab, split)
    special, _ = added_tokens(vocab, {})
    backend.add_special_tokens(special)
    _, plain = added_tokens(vocab, backend.get_vocab(with_added_tokens=True))
    backend.add_tokens(plain)
    settings: dict[str, Any] = dict(vocab.special_tokens)
    if vocab.chat_template is not None:
        settings["chat_template"] = vocab.chat_template
    for name in ("add_bos_token", "add_eos_token"):
        if getattr(vocab, name) is not None:
            settings[name] = getattr(vocab, name)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **settings)


def transformers_gguf_tokenizer(gguf_path: Path, model_type: str | None = None) -> Any:
    """The tokenizer as ``AutoTokenizer.from_pretrained(folder, gguf_file=...)`` builds it
    (told the model type where transformers maps one, so it does not rebuild the config)."""
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    kwargs: dict[str, Any] = {"gguf_file": gguf_path.name}
    if model_type in TOKENIZER_MAPPING_NAMES:
        kwargs["tokenizer_type"] = model_type
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)


def gguf_tokenizer(gguf_path: Path, model_type: str | None = None,
                   gguf: GGUFFile | None = None) -> Any:
    """``gguf_path``'s tokenizer: built here for a byte-level vocabulary, by transformers for
    any other (or where this transformers has no split-regex table).

    Args:
        gguf_path: The GGUF file.
        model_type: The config's ``model_type``, for transformers' route.
        gguf: The file already opened, to skip parsing its header again.

    Raises:
        Whatever transformers or ``tokenizers`` raise on a broken vocabulary (the caller
        wraps it in a ModelSourceError).
    """
    gguf = gguf if gguf is not None else GGUFFile(gguf_path)
    if gguf.metadata.get("tokenizer.ggml.model") == BYTE_LEVEL_MODEL:
        vocab = read_vocab(gguf)
        try:
            split = split_regex(vocab.pre)
        except ImportError:
            return transformers_gguf_tokenizer(gguf_path, model_type)
        return build_byte_level_tokenizer(vocab, split)
    return transformers_gguf_tokenizer(gguf_path, model_type)
