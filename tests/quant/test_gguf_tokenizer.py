"""The tokenizer built from a GGUF file's metadata (engine.model_source.gguf_tokenizer) equals
the one transformers builds from the same file (``AutoTokenizer.from_pretrained(folder,
gguf_file=...)``): the same ids and decoded text on a set of texts, the same special tokens,
added tokens and chat template, on small byte-level GGUF files written here (each pre-tokenizer
kind, added tokens of every llama.cpp type, BOS added or not). The same check on SmolLM2's real
file is ``integration_tests/test_gguf_tokenizer_smollm2.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from langchain_ascend.engine.model_source import gguf_tokenizer as gt  # noqa: E402
from langchain_ascend.quant.gguf_file import GGUFFile  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXTS = [
    "Hello world", " leading space", "  two  spaces\n\n\ttab\r\n", "don't we've they'll I'M",
    "x = 12345 + 678.9", "naïve café 😀 中文 Ελληνικά", "<|im_start|>user\nHi<|im_end|>\n",
    "<think>plan</think> done", "a b<|bad token|>c", "", "the theme then there ",
]
MERGES = ["Ġ t", "t h", "h e", "th e", "Ġt he", "Ġ a", "e r", "Ġ w", "o r", "i n", "1 2",
          "12 3", "m e", "Ġthe me", "l l", "e ll", "h ell", "hell o"]


def _vocabulary() -> tuple[list[str], list[int]]:
    """Specials first, then every byte of the alphabet, then one token per merge, then a token
    llama.cpp stored with a raw space, a user-defined token and a mislabelled control token."""
    alphabet = list(gt.byte_alphabet().values())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *alphabet]
    tokens += [merge.replace(" ", "") for merge in MERGES]
    tokens += ["a b", "<think>", "</think>", "<|bad token|>"]
    kinds = [3, 3, 3] + [1] * (len(tokens) - 7) + [1, 4, 4, 3]
    return tokens, kinds


def write_tokenizer_gguf(path: Path, *, pre: str, add_bos: bool | None,
                         template: str | None = TEMPLATE) -> Path:
    """A one-layer llama GGUF whose metadata carries a byte-level vocabulary (transformers
    reads the architecture keys to build its config first)."""
    tokens, kinds = _vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tokenizer test")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(4)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(0)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _transformers(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def assert_same_tokenizer(ours, theirs) -> None:
    """Ids, decoded text (with and without special tokens), special and added tokens, the
    chat template and its rendering."""
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == ids, text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip), text
    for attribute in ("bos_token", "eos_token", "unk_token", "pad_token", "all_special_tokens",
                      "all_special_ids", "chat_template"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert ours.get_vocab() == theirs.get_vocab()
    assert {i: str(t) for i, t in ours.added_tokens_decoder.items()} == {
        i: str(t) for i, t in theirs.added_tokens_decoder.items()}
    if theirs.chat_template:
        messages = [{"role": "user", "content": "hi <think>"}]
        assert ours.apply_chat_template(messages, add_generation_prompt=True) == (
            theirs.apply_chat_template(messages, add_generation_prompt=True))


@pytest.mark.parametrize("pre", ["default", "qwen2", "llama-bpe", "smollm"])
@pytest.mark.parametrize("add_bos", [None, True])
def test_byte_level_tokenizer_equals_transformers(tmp_path, pre, add_bos) -> None:
    path = write_tokenizer_gguf(tmp_path / "vocab.gguf", pre=pre, add_bos=add_bos)
    ours = gt.gguf_tokenizer(path, "llama")
    assert type(ours).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    assert_same_tokenizer(ours, _transformers(path))


def test_saved_folder_reloads_the_same_tokenizer(tmp_path) -> None:
    from transformers import AutoTokenizer

    path = write_tokenizer_gguf(tmp_path / "vocab.gguf", pre="qwen2", add_bos=True)
    gt.gguf_tokenizer(path, "llama").save_pretrained(tmp_path / "saved")
    assert_same_tokenizer(AutoTokenizer.from_pretrained(tmp_path / "saved"), _transformers(path))


def test_without_a_chat_template(tmp_path) -> None:
    path = write_tokenizer_gguf(tmp_path / "vocab.gguf", pre="default", add_bos=None,
                                template=None)
    ours = gt.gguf_tokenizer(path, "llama")
    assert ours.chat_template is None
    assert_same_tokenizer(ours, _transformers(path))


def test_read_vocab_decodes_the_arrays(tmp_path) -> None:
    path = write_tokenizer_gguf(tmp_path / "vocab.gguf", pre="qwen2", add_bos=False)
    vocab = gt.read_vocab(GGUFFile(path))
    tokens, kinds = _vocabulary()
    assert (vocab.model, vocab.pre, vocab.tokens, vocab.token_types, vocab.merges) == (
        "gpt2", "qwen2", tokens, kinds, MERGES)
    assert vocab.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                    "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    assert (vocab.add_bos_token, vocab.add_eos_token, vocab.chat_template) == (
        False, None, TEMPLATE)


def test_byte_alphabet_is_a_bijection_onto_printable_characters() -> None:
    spelling = gt.byte_alphabet()
    assert sorted(spelling) == list(range(256))
    assert len(set(spelling.values())) == 256
    assert all(character.isprintable() and not character.isspace()
               for character in spelling.values())
    assert (spelling[ord("a")], spelling[ord(" ")], spelling[ord("\n")]) == ("a", "Ġ", "Ċ")


def test_a_sentencepiece_vocabulary_goes_through_transformers(tmp_path, monkeypatch) -> None:
    path = write_tokenizer_gguf(tmp_path / "vocab.gguf", pre="default", add_bos=None)
    calls = []
    monkeypatch.setattr(gt, "transformers_gguf_tokenizer",
                        lambda gguf_path, model_type: calls.append((gguf_path, model_type)))
    gguf_file = GGUFFile(path)
    gguf_file.metadata["tokenizer.ggml.model"] = "llama"
    gt.gguf_tokenizer(path, "llama", gguf_file)
    assert calls == [(path, "llama")]


def test_without_transformers_split_table_falls_back(tmp_path, monkeypatch) -> None:
    path = write_tokenizer_gguf(tmp_path / "vocab.gguf", pre="qwen2", add_bos=None)

    def no_table(pre):
        raise ImportError("no table")

    calls = []
    monkeypatch.setattr(gt, "split_regex", no_table)
    monkeypatch.setattr(gt, "transformers_gguf_tokenizer",
                        lambda gguf_path, model_type: calls.append(gguf_path))
    gt.gguf_tokenizer(path, "llama")
    assert calls == [path]
