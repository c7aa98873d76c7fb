"""Incremental detokenization: multi-byte characters, stop strings and hold-back."""

from __future__ import annotations

import pytest

from langchain_ascend.engine.detokenizer import IncrementalDetokenizer, TextDecoder
from langchain_ascend.testing import build_tokenizer, load_tokenizer

TEXT = "héllo 你好世界 🙂 stop here, done"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tokenizer())


def feed(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    deltas = []
    for tok in ids:
        detok.add_token(tok)
        deltas.append(detok.take_delta())
        if detok.stop_string is not None:
            break
    detok.finish()
    deltas.append(detok.take_delta(final=True))
    return deltas


def test_multibyte_characters_never_stream_replacement_chars(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert len(ids) > len(TEXT.split())  # characters really are split over tokens
    deltas = feed(IncrementalDetokenizer(TextDecoder(tokenizer)), ids)
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # some tokens produced no text: an unfinished character


def test_matches_full_decode_of_special_and_plain_tokens(tokenizer):
    ids = tokenizer.encode("a b") + [tokenizer.eos_token_id] + tokenizer.encode(" c")
    detok = IncrementalDetokenizer(TextDecoder(tokenizer))
    text = "".join(feed(detok, ids))
    assert text == tokenizer.decode(ids, skip_special_tokens=True) == "a b c"


def test_stop_string_spanning_tokens_is_caught_and_removed(tokenizer):
    ids = tokenizer.encode(TEXT)
    detok = IncrementalDetokenizer(TextDecoder(tokenizer), stop=["stop here"])
    deltas = feed(detok, ids)
    assert detok.stop_string == "stop here"
    assert "".join(deltas) == "héllo 你好世界 🙂 "
    assert detok.text == "héllo 你好世界 🙂 "
    # tokens after the stop are not read
    assert len(detok.token_ids) < len(ids)


def test_text_that_may_start_a_stop_string_is_held_back(tokenizer):
    detok = IncrementalDetokenizer(TextDecoder(tokenizer), stop=["END!"])
    out = []
    for piece in ["ab", "E", "N", "x"]:
        for tok in tokenizer.encode(piece):
            detok.add_token(tok)
        out.append(detok.take_delta())
    assert out == ["ab", "", "", "ENx"]
    assert detok.stop_string is None


def test_earliest_of_several_stop_strings_wins(tokenizer):
    detok = IncrementalDetokenizer(TextDecoder(tokenizer), stop=["lo", "hé"])
    feed(detok, tokenizer.encode("xhéllo"))
    assert detok.stop_string == "hé"
    assert detok.text == "x"


def test_invalid_bytes_are_flushed_at_the_end(tokenizer):
    ids = tokenizer.encode("你")[:1]  # first byte of a 3-byte character only
    detok = IncrementalDetokenizer(TextDecoder(tokenizer))
    detok.add_token(ids[0])
    assert detok.take_delta() == ""
    detok.finish()
    assert detok.take_delta(final=True) == "\ufffd"


def test_long_run_of_invalid_bytes_is_not_held_forever(tokenizer):
    lone = tokenizer.encode("你")[0]
    detok = IncrementalDetokenizer(TextDecoder(tokenizer))
    for _ in range(6):
        detok.add_token(lone)
    assert "\ufffd" in detok.take_delta()


class _MarkerTokenizer:
    """ids 0..9 decode to digits; 7 is the special ``<tool_call>``, 2 the special EOS."""

    all_special_tokens = ["<eos>"]
    all_special_ids = [2]

    def __init__(self):
        from tokenizers import AddedToken

        self.added_tokens_decoder = {7: AddedToken("<tool_call>", special=True),
                                     8: AddedToken("<x>", special=False)}

    def decode(self, ids, skip_special_tokens=True):
        names = {7: "<tool_call>", 2: "<eos>"}
        return "".join(names.get(i, str(i)) for i in ids
                       if not (skip_special_tokens and i in names))


def test_special_tokens_include_added_tokens_marked_special():
    from langchain_ascend.engine.detokenizer import special_tokens_of

    assert special_tokens_of(_MarkerTokenizer()) == {"<eos>": 2, "<tool_call>": 7}


def test_kept_special_tokens_are_text_and_other_specials_are_dropped():
    tokenizer = _MarkerTokenizer()
    plain = TextDecoder(tokenizer)
    keeping = TextDecoder(tokenizer, keep={7}, special_ids={2, 7})
    ids = [7, 1, 3, 2]
    assert plain(ids) == "13"
    assert keeping(ids) == "<tool_call>13"
    detok = IncrementalDetokenizer(keeping)
    assert "".join(feed(detok, ids)) == "<tool_call>13"


# ---------------------------------------------------------------- DecodeStream vs the window


def stream_and_window(tokenizer, ids, **kwargs):
    """The deltas of the DecodeStream path and of the Python window on the same ids."""
    from langchain_ascend.engine.detokenizer import stream_backend

    assert stream_backend(tokenizer) is not None  # the tiny tokenizer is a fast one
    keep, special = kwargs.pop("keep", ()), kwargs.pop("special_ids", ())
    return [feed(IncrementalDetokenizer(TextDecoder(tokenizer, keep, special,
                                                    streaming=streaming), **kwargs), ids)
            for streaming in (True, False)]


def test_the_stream_gives_the_window_s_deltas(tokenizer):
    ids = tokenizer.encode(TEXT)
    streamed, windowed = stream_and_window(tokenizer, ids)
    assert streamed == windowed and "".join(streamed) == TEXT
    streamed, windowed = stream_and_window(tokenizer, ids, stop=["stop here"])
    assert streamed == windowed and "".join(streamed) == "héllo 你好世界 🙂 "


def test_the_stream_keeps_kept_specials_and_drops_the_others(tokenizer):
    eos = tokenizer.eos_token_id
    special = {t for t in tokenizer.all_special_ids}
    ids = tokenizer.encode("a b") + [eos] + tokenizer.encode(" c")
    streamed, windowed = stream_and_window(tokenizer, ids)
    assert streamed == windowed and tokenizer.eos_token not in "".join(streamed)
    streamed, windowed = stream_and_window(tokenizer, ids, keep={eos}, special_ids=special)
    assert streamed == windowed and tokenizer.eos_token in "".join(streamed)


def test_invalid_bytes_are_flushed_and_the_stream_goes_on(tokenizer):
    lone = tokenizer.encode("你")[0]  # the first byte of a 3-byte character, again and again
    ids = [lone] * 6 + tokenizer.encode(" and then 世界")
    streamed, windowed = stream_and_window(tokenizer, ids)
    assert streamed == windowed
    assert "\ufffd" in "".join(streamed) and "".join(streamed).endswith(" and then 世界")


def test_tokenizers_that_decode_otherwise_do_not_stream(tokenizer):
    from langchain_ascend.engine.detokenizer import stream_backend

    assert stream_backend(_MarkerTokenizer()) is None
    assert TextDecoder(tokenizer, streaming=False).stream() is None
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert stream_backend(tokenizer) is None
    finally:
        tokenizer.clean_up_tokenization_spaces = False
