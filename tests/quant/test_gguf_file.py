"""The one GGUF reader: the header parsed once and shared, tensors used in place from the file's
map (a loaded model's blocks lie in it where no re-laying is needed), pages of re-laid tensors
given back, and a typed error naming what is wrong with a bad or truncated file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_fixtures import write_gguf

from langchain_ascend.errors import ModelSourceError
from langchain_ascend.quant.embedding import QuantizedEmbedding
from langchain_ascend.quant.gguf_file import (
    GGUFFile,
    GGUFFormatError,
    in_mapped_file,
    read_header,
    release_pages,
)
from langchain_ascend.quant.gguf_model import load_gguf_model
from langchain_ascend.quant.linear import QuantizedLinear
from langchain_ascend.testing import build_model

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf_file")
    return {"qwen2": write_gguf(build_model("tiny", "qwen2"), root / "qwen2.gguf",
                                linear_type="Q8_0"),
            "llama": write_gguf(build_model("tiny", "llama"), root / "llama.gguf", tie=True)}


def test_a_loaded_model_reads_its_blocks_from_the_file_map(files: dict[str, Path]) -> None:
    model, _ = load_gguf_model(files["qwen2"])  # qwen2: no row re-ordering, nothing copied
    file = GGUFFile(files["qwen2"])
    layer = model.model.layers[1]
    for module, name in ((layer.mlp.down_proj, "blk.1.ffn_down.weight"),
                         (layer.self_attn.q_proj, "blk.1.attn_q.weight"),
                         (layer.mlp.gate_proj, "blk.1.ffn_gate.weight")):
        assert isinstance(module, QuantizedLinear)
        assert in_mapped_file(module.blocks)
        # the same bytes, read in place: the model's view and a fresh map of the file agree
        assert torch.equal(module.blocks, file.tensor(name))
        assert module.blocks.untyped_storage().nbytes() == file.tensors[name].nbytes
    assert isinstance(model.model.embed_tokens, QuantizedEmbedding)
    assert in_mapped_file(model.model.embed_tokens.blocks)
    assert not in_mapped_file(model.model.norm.weight)  # float tensors are the model's own


def test_the_view_is_the_file_tensor_and_rotary_rows_are_the_one_copy(
        files: dict[str, Path]) -> None:
    model, _ = load_gguf_model(files["llama"])
    file = GGUFFile(files["llama"])
    layer = model.model.layers[0]
    assert in_mapped_file(layer.mlp.up_proj.blocks)
    assert not in_mapped_file(layer.self_attn.q_proj.blocks)  # rows re-ordered: a copy
    assert not in_mapped_file(layer.self_attn.k_proj.blocks)
    assert in_mapped_file(layer.self_attn.v_proj.blocks)
    head, table = model.lm_head, model.model.embed_tokens  # tied: one view for both
    assert head.blocks.data_ptr() == table.blocks.data_ptr()
    assert torch.equal(table.blocks, file.tensor("token_embd.weight"))


def test_released_pages_read_back_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    values = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)  # 1 MiB
    writer.add_tensor("big.weight", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = GGUFFile(path)
    view = file.tensor("big.weight")
    before = view.clone()
    assert release_pages(view) >= view.numel() - 2 * 4096  # every whole page inside it
    assert torch.equal(view, before)  # faulted in again from the file
    assert release_pages(before) == 0  # not in a file's map: left alone
    assert np.array_equal(file.floats("big.weight"), values)


def test_the_header_is_parsed_once_and_shared(files: dict[str, Path]) -> None:
    header = read_header(files["qwen2"])
    assert read_header(str(files["qwen2"])) is header
    first, second = GGUFFile(files["qwen2"]), GGUFFile(files["qwen2"])
    assert first.header is second.header is header
    first.metadata["tokenizer.ggml.model"] = "changed"  # each file object has its own dict
    assert second.metadata["tokenizer.ggml.model"] == "gpt2"
    tokens = first.array("tokenizer.ggml.tokens")
    assert header.metadata["tokenizer.ggml.tokens"] == len(tokens) > 100
    assert all(isinstance(token, str) for token in tokens)
    with pytest.raises(GGUFFormatError, match="not an array"):
        first.array("general.architecture")
    with pytest.raises(KeyError):
        first.array("no.such.key")


def _tiny_file(path: Path) -> bytes:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(50)])
    writer.add_tensor("w", np.ones((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("where", ["fixed", "vocabulary", "table", "data"])
def test_a_truncated_file_is_a_typed_error(tmp_path: Path, where: str) -> None:
    whole = _tiny_file(tmp_path / "whole.gguf")
    cut = {"fixed": 12, "vocabulary": whole.index(b"t25") + 1,
           "table": whole.rindex(b"w") + 3, "data": len(whole) - 1}[where]
    path = tmp_path / f"cut-{where}.gguf"
    path.write_bytes(whole[:cut])
    with pytest.raises(GGUFFormatError, match="truncated") as caught:
        GGUFFile(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, ModelSourceError)  # callers catch the package's error
    with pytest.raises(ModelSourceError, match="truncated"):
        load_gguf_model(path)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda b: b"GGML" + b[4:], "magic"),
    (lambda b: b[:4] + struct.pack(">I", 3) + b[8:], "big-endian"),
    (lambda b: b[:4] + struct.pack("<I", 7) + b[8:], "version 7"),
    (lambda b: b"", "empty"),
])
def test_a_bad_file_is_a_typed_error(tmp_path: Path, change, needle: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(change(_tiny_file(tmp_path / "good.gguf")))
    with pytest.raises(GGUFFormatError, match=needle):
        read_header(path)


def test_an_unknown_value_type_is_named(tmp_path: Path) -> None:
    whole = bytearray(_tiny_file(tmp_path / "good.gguf"))
    key = b"general.architecture"
    at = whole.index(key) + len(key)  # the value type that follows the first key
    whole[at:at + 4] = struct.pack("<I", 99)
    path = tmp_path / "odd.gguf"
    path.write_bytes(bytes(whole))
    with pytest.raises(GGUFFormatError, match="unknown metadata value type 99"):
        read_header(path)
