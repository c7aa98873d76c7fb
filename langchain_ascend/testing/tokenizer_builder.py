"""Train and cache Qwen2.5-style byte-level BPE tokenizers on the bundled English text.

The tokenizer copies Qwen2.5's shape, not its vocabulary: NFC normalisation, Qwen's
pre-tokenisation regex (single digits, words with one leading non-letter), byte-level
encoding over all 256 bytes (so any text encodes and any id decodes), the Qwen2.5/Qwen3 added
tokens appended after the learned vocabulary, ``<|im_end|>`` as EOS, ``<|endoftext|>`` as
padding, and a ChatML chat template that renders tools like Qwen2.5-Instruct.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from langchain_ascend.testing.cache import (
    TOKENIZER_SOURCES,
    build_once,
    builder_fingerprint,
    resolve_cache_dir,
)
from langchain_ascend.testing.corpus import training_lines

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Qwen2.5's added tokens in Qwen's order, then the ones Qwen3 appended; True = special.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    (ENDOFTEXT, True),
    (IM_START, True),
    (IM_END, True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# Qwen2's pre-tokenisation: contractions, words with one optional leading non-letter, single
# digits, punctuation runs, newlines and other whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

DEFAULT_VOCAB_SIZE = 4096
MIN_VOCAB_SIZE = 512
MODEL_MAX_LENGTH = 32768
TOKENIZER_SEED = 0
# Template-generated lines always added. The English text supports only ~2400 learned tokens;
# each invented-word sentence supports ~10 more, so they scale with the vocabulary (2x margin).
_GENERATED_LINES = 6000
_ENGLISH_TOKENS = 2000
_TOKENS_PER_INVENTED_SENTENCE = 5


def chat_template() -> str:
    """Return the bundled Qwen2.5-style ChatML Jinja chat template."""
    return (
        resources.files("langchain_ascend.testing")
        .joinpath("data/chat_template.jinja")
        .read_text(encoding="utf-8")
    )


def _invented_sentences_for(vocab_size: int) -> int:
    extra_tokens = max(0, vocab_size - _ENGLISH_TOKENS)
    return 200 + extra_tokens // _TOKENS_PER_INVENTED_SENTENCE


def _train_backend(vocab_size: int) -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    learned_size = vocab_size - len(ADDED_TOKENS)
    backend = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=learned_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    lines = training_lines(
        seed=TOKENIZER_SEED,
        num_generated=_GENERATED_LINES,
        num_invented=_invented_sentences_for(vocab_size),
    )
    backend.train_from_iterator(lines, trainer=trainer)
    if backend.get_vocab_size() != learned_size:
        raise RuntimeError(
            f"BPE training learned {backend.get_vocab_size()} tokens, expected {learned_size}: "
            "the generated training text is too small for this vocabulary size"
        )
    backend.add_tokens(
        [
            AddedToken(content, special=special, normalized=False)
            for content, special in ADDED_TOKENS
        ]
    )
    return backend


def _write_tokenizer(out_dir: Path, vocab_size: int) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_backend(vocab_size),
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[content for content, special in ADDED_TOKENS if special],
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        chat_template=chat_template(),
    )
    if len(tokenizer) != vocab_size:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, expected {vocab_size}")
    tokenizer.save_pretrained(out_dir)


def build_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE, *, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Train (once) and cache a tokenizer with exactly ``vocab_size`` tokens.

    Args:
        vocab_size: Total number of tokens, added tokens included (``len(tokenizer)``).
        cache_dir: Cache folder; defaults to ``models/`` of the package's cache root
            (``$LANGCHAIN_ASCEND_CACHE``, else ``$XDG_CACHE_HOME/langchain_ascend`` or
            ``~/.cache/langchain_ascend``).

    Returns:
        Folder loadable with ``AutoTokenizer.from_pretrained``.

    Raises:
        ValueError: If ``vocab_size`` is below :data:`MIN_VOCAB_SIZE`.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}")
    root = resolve_cache_dir(cache_dir)
    fingerprint = builder_fingerprint(TOKENIZER_SOURCES, "tokenizer", vocab_size, TOKENIZER_SEED)
    final_dir = root / f"tokenizer-v{vocab_size}-{fingerprint}"
    return build_once(final_dir, lambda out_dir: _write_tokenizer(out_dir, vocab_size))


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """Load a tokenizer folder built here through ``AutoTokenizer.from_pretrained``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.fspath(path))


def tokenizer_files(path: str | os.PathLike[str]) -> list[Path]:
    """Return the files of a built tokenizer folder (what a model folder copies in)."""
    return sorted(p for p in Path(path).iterdir() if p.is_file())
