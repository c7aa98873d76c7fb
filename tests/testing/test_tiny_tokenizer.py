"""The offline Qwen2.5-style byte-level BPE tokenizers."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, GenerationConfig

from langchain_ascend.testing import (
    ADDED_TOKENS,
    PRESETS,
    build_tokenizer,
    chat_template,
    load_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


@pytest.fixture(scope="module")
def bench_tokenizer():
    return load_tokenizer(build_tokenizer(PRESETS["bench"].vocab_size))


def _assert_every_id_decodes(tokenizer, vocab_size: int) -> None:
    pieces = [tokenizer.decode([token_id]) for token_id in range(vocab_size)]
    assert all(isinstance(piece, str) for piece in pieces)
    batch = tokenizer.batch_decode([[token_id] for token_id in range(vocab_size)])
    assert batch == pieces
    assert isinstance(tokenizer.decode(list(range(vocab_size))), str)
    assert tokenizer.convert_ids_to_tokens(list(range(vocab_size))).count(None) == 0


def test_tiny_every_id_decodes_and_length_matches(tokenizer) -> None:
    assert len(tokenizer) == PRESETS["tiny"].vocab_size
    _assert_every_id_decodes(tokenizer, len(tokenizer))


def test_bench_tokenizer_has_full_vocabulary_and_every_id_decodes(bench_tokenizer) -> None:
    assert len(bench_tokenizer) == PRESETS["bench"].vocab_size >= 32768
    _assert_every_id_decodes(bench_tokenizer, len(bench_tokenizer))
    # A large learned vocabulary merges common English words into single tokens.
    assert len(bench_tokenizer.tokenize("The weather in Paris is sunny today.")) <= 9


def test_added_tokens_follow_learned_vocabulary_in_qwen_order(tokenizer) -> None:
    first = len(tokenizer) - len(ADDED_TOKENS)
    for offset, (content, _special) in enumerate(ADDED_TOKENS):
        assert tokenizer.convert_tokens_to_ids(content) == first + offset
        assert tokenizer.encode(content, add_special_tokens=False) == [first + offset]


def test_eos_pad_and_special_flags(tokenizer) -> None:
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    ids = tokenizer.encode("<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>")
    # As in Qwen2.5, <tool_call> is an added but not special token: it survives skipping.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Paris is 23 degrees.",
        '{"name": "get_weather", "arguments": {"city": "São Paulo", "days": 3}}',
        "  leading spaces, tabs\tand\nnew lines\r\n",
        "Unicode: 北京 東京 Ελληνικά emoji 🌦️ — café",
        "",
    ],
)
def test_encode_decode_round_trip(tokenizer, text) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= token_id < len(tokenizer) for token_id in ids)
    assert tokenizer.decode(ids) == text


def test_digits_are_split_one_per_token_like_qwen(tokenizer) -> None:
    assert tokenizer.tokenize("2024") == ["2", "0", "2", "4"]


def test_generation_config_lists_both_eos_ids(tiny_model_paths) -> None:
    for path in tiny_model_paths.values():
        tokenizer = AutoTokenizer.from_pretrained(path)
        generation = GenerationConfig.from_pretrained(path)
        im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
        assert generation.eos_token_id == [im_end, endoftext]
        assert generation.pad_token_id == endoftext == tokenizer.pad_token_id


def test_model_folder_carries_fast_tokenizer_and_template(tiny_qwen2_path, tokenizer) -> None:
    config = json.loads((tiny_qwen2_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert tokenizer.is_fast
    assert tokenizer.chat_template == chat_template()


def test_too_small_vocabulary_is_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        build_tokenizer(100, cache_dir=tmp_path)
