"""inspect_gguf parses a file's header once per file version (a demo's setup asks six times),
reads again after the file changes, and still names a vocabulary cut short as truncated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from langchain_ascend.engine.model_source import inspect_gguf  # noqa: E402
from langchain_ascend.errors import ModelSourceError  # noqa: E402


def write_named_gguf(path: Path, name: str, vocab: list[str]) -> Path:
    """A tiny well-formed GGUF file: a name, a context length, a vocabulary, one tensor."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(64)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(vocab)
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_same_file_is_parsed_once(tmp_path):
    path = write_named_gguf(tmp_path / "m.gguf", "first", ["a", "b", "c"])
    info = inspect_gguf(path)
    assert info.name == "first"
    assert inspect_gguf(path) is info
    assert inspect_gguf(str(path)) is info
    with pytest.raises(TypeError):  # the shared values cannot be changed by one caller
        info.values["general.name"] = "changed"  # type: ignore[index]


def test_a_rewritten_file_is_read_again(tmp_path):
    path = write_named_gguf(tmp_path / "m.gguf", "first", ["a", "b", "c"])
    assert inspect_gguf(path).name == "first"
    stamp = os.stat(path).st_mtime_ns
    write_named_gguf(path, "other", ["a", "b", "c"])  # same size, new content
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    info = inspect_gguf(path)
    assert info.name == "other"


def test_vocabulary_strings_are_skipped_and_checked(tmp_path):
    vocab = [f"token{i}" for i in range(3000)]
    path = write_named_gguf(tmp_path / "big.gguf", "big", vocab)
    info = inspect_gguf(path)
    assert info.has_tokenizer and info.num_tensors == 1
    assert "tokenizer.ggml.tokens" not in info.values  # arrays are skipped, not read
    whole = path.read_bytes()
    start = whole.index(b"token1500")
    for cut in (start - 3, start + 4):  # inside a length prefix, inside a string
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(whole[:cut])
        with pytest.raises(ModelSourceError, match="truncated"):
            inspect_gguf(short)
