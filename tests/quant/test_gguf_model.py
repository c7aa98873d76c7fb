"""load_gguf_model on small GGUF files written from the tiny random models: the same logits as
transformers' own (de-quantizing) GGUF loader, the file's blocks kept as they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_fixtures import llama_cpp_rows, write_gguf
from torch import nn

from langchain_ascend.errors import ModelSourceError
from langchain_ascend.quant import formats
from langchain_ascend.quant.embedding import QuantizedEmbedding
from langchain_ascend.quant.gguf_config import gguf_config_dict, load_gguf_config
from langchain_ascend.quant.gguf_file import GGUFFile, GGUFFormatError
from langchain_ascend.quant.gguf_model import (
    load_gguf_model,
    rotary_row_order,
    target_format,
)
from langchain_ascend.quant.linear import QuantizedLinear, use_reference
from langchain_ascend.testing import build_model

IDS = torch.tensor([[5, 17, 300, 4000, 2, 99, 1024, 7]])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    llama = build_model("tiny", "llama")
    return {
        "llama": write_gguf(llama, root / "llama-q4_1.gguf"),
        "llama_tied": write_gguf(llama, root / "llama-tied.gguf", tie=True),
        "llama_mixed": write_gguf(
            llama, root / "llama-mixed.gguf", linear_type="Q4_0", embed_type="F16",
            types={"blk.0.ffn_down.weight": "Q5_1", "blk.1.attn_v.weight": "F16",
                   "blk.1.attn_q.weight": "Q8_0", "blk.0.attn_k.weight": "Q5_0"}),
        "qwen2": write_gguf(build_model("tiny", "qwen2"), root / "qwen2.gguf",
                            linear_type="Q8_0"),
        "qwen3": write_gguf(build_model("tiny", "qwen3"), root / "qwen3.gguf"),
    }


def _transformers_model(path: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                dtype=torch.float32).eval()


def _logits(model: nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits[0]  # (T, V)


def test_rotary_row_order_undoes_llama_cpp_rows() -> None:
    weight = np.arange(24 * 3).reshape(24, 3)
    for heads in (1, 2, 3):
        assert np.array_equal(llama_cpp_rows(weight, heads)[rotary_row_order(24, heads)], weight)


def test_target_formats() -> None:
    q4_0, q4_1, q8_0, f32, f16, q5_1, q4_k, q5_k, q6_k = 2, 3, 8, 0, 1, 7, 12, 13, 14
    assert [target_format(t, "gguf") for t in (q4_0, q4_1, q8_0, f32, f16)] == [
        "q4_0", "q4_1", "q8_0", None, None]
    assert [target_format(t, "gguf") for t in (q5_1, q4_k, q5_k, q6_k)] == [
        "q5_1", "q4_k", "q5_k", "q6_k"]  # read as they are
    q2_k, q3_k, q8_k, iq4_nl, iq2_xxs = 10, 11, 15, 20, 16  # re-quantized
    assert [target_format(t, "gguf") for t in (q2_k, q3_k, q8_k, iq4_nl, iq2_xxs)] == [
        "q4_1", "q4_1", "q8_0", "q4_1", "q4_1"]
    assert {target_format(t, "int8") for t in (q4_0, f32, q6_k)} == {"q8_0"}
    assert [target_format(t, "int4") for t in (q4_0, q4_1, q8_0, f16)] == [
        "q4_0", "q4_1", "q4_1", "q4_1"]
    assert target_format(q4_1, "none") is None
    with pytest.raises(ValueError, match="quantization"):
        target_format(q4_1, "int3")


@pytest.mark.parametrize("name", ["llama", "llama_tied", "qwen2"])
def test_logits_match_transformers_gguf_loader(files: dict[str, Path], name: str) -> None:
    """Same weights as transformers' de-quantized model: the weights-only reference product
    gives its logits (q/k rows reordered back, biases and q/k norms carried)."""
    model, report = load_gguf_model(files[name])
    assert use_reference(model) > 0
    expected = _logits(_transformers_model(files[name]))
    torch.testing.assert_close(_logits(model), expected, rtol=1e-4, atol=1e-4)
    assert report.quantized_bytes > 0 and report.weight_bytes > report.quantized_bytes


def test_qwen3_logits_match_its_quantized_float_model(files: dict[str, Path]) -> None:
    """transformers builds no tiny Qwen3 from GGUF (it leaves head_dim at 128): the reference
    is the original model with each weight as the file stores it (gguf's own quantize and
    de-quantize of the original values)."""
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    folder = build_model("tiny", "qwen3")
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    kinds = {"Q4_1": gguf.GGMLQuantizationType.Q4_1, "Q8_0": gguf.GGMLQuantizationType.Q8_0}
    with torch.no_grad():
        for name, tensor in load_file(str(folder / "model.safetensors")).items():
            if tensor.dim() != 2:
                continue
            kind = kinds["Q8_0" if "embed_tokens" in name else "Q4_1"]
            values = gguf.quants.dequantize(gguf.quants.quantize(tensor.float().numpy(), kind),
                                            kind)
            reference.get_parameter(name).copy_(torch.from_numpy(values))
    model, _ = load_gguf_model(files["qwen3"])
    assert model.config.head_dim == 32
    use_reference(model)
    torch.testing.assert_close(_logits(model), _logits(reference), rtol=1e-4, atol=1e-4)


def test_blocks_are_the_file_bytes(files: dict[str, Path]) -> None:
    model, report = load_gguf_model(files["llama"])
    gguf = GGUFFile(files["llama"])
    down = model.model.layers[0].mlp.down_proj
    assert isinstance(down, QuantizedLinear) and down.fmt == "q4_1"
    assert np.array_equal(down.blocks.numpy(), np.asarray(gguf.raw("blk.0.ffn_down.weight")))
    q_proj = model.model.layers[1].self_attn.q_proj
    order = rotary_row_order(q_proj.out_features, model.config.num_attention_heads)
    assert np.array_equal(q_proj.blocks.numpy(), np.asarray(gguf.raw("blk.1.attn_q.weight"))[order])
    assert isinstance(model.model.embed_tokens, QuantizedEmbedding)
    assert isinstance(model.lm_head, QuantizedLinear) and model.lm_head.fmt == "q8_0"
    assert dict(report.formats) == {"q4_1": 14, "q8_0": 1} and report.requantized == []
    assert report.weight_format == "q4_1+q8_0"


def test_a_tied_head_shares_the_embedding_blocks(files: dict[str, Path]) -> None:
    model, _ = load_gguf_model(files["llama_tied"])
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and isinstance(head, QuantizedLinear)
    assert head.blocks.data_ptr() == embedding.blocks.data_ptr()


def test_mixed_types_run_their_own_blocks_or_stay_float(files: dict[str, Path]) -> None:
    # (Types that are re-quantized -- Q2_K, Q3_K, IQ* -- need 256-wide rows: test_kquant_model)
    model, report = load_gguf_model(files["llama_mixed"])
    layers = model.model.layers
    assert layers[0].mlp.down_proj.fmt == "q5_1"
    assert layers[0].self_attn.k_proj.fmt == "q5_0"
    assert layers[1].self_attn.q_proj.fmt == "q8_0"
    assert layers[0].mlp.up_proj.fmt == "q4_0"
    assert type(layers[1].self_attn.v_proj) is nn.Linear  # F16 stays float
    assert type(model.get_input_embeddings()) is nn.Embedding  # untied F16 embedding
    assert type(model.lm_head) is nn.Linear
    assert report.requantized == []
    gguf = GGUFFile(files["llama_mixed"])
    assert np.array_equal(layers[0].mlp.down_proj.blocks.numpy(),
                          np.asarray(gguf.raw("blk.0.ffn_down.weight")))
    k_proj = layers[0].self_attn.k_proj
    order = rotary_row_order(k_proj.out_features, model.config.num_key_value_heads)
    assert np.array_equal(k_proj.blocks.numpy(),
                          np.asarray(gguf.raw("blk.0.attn_k.weight"))[order])
    use_reference(model)
    torch.testing.assert_close(_logits(model), _logits(_transformers_model(files["llama_mixed"])),
                               rtol=1e-4, atol=1e-4)


def test_int8_int4_and_none(files: dict[str, Path]) -> None:
    path = files["llama_mixed"]
    int8, report8 = load_gguf_model(path, quantization="int8")
    assert set(report8.formats) == {"q8_0"} and report8.formats["q8_0"] == 15
    int4, report4 = load_gguf_model(path, quantization="int4")
    assert set(report4.formats) == {"q4_0", "q4_1"}
    gguf = GGUFFile(path)
    up = int4.model.layers[0].mlp.up_proj  # Q4_0 in the file: its own bytes
    assert np.array_equal(up.blocks.numpy(), np.asarray(gguf.raw("blk.0.ffn_up.weight")))
    v_proj = torch.from_numpy(gguf.floats("blk.1.attn_v.weight"))  # F16 in the file
    assert torch.equal(int8.model.layers[1].self_attn.v_proj.blocks,
                       formats.quantize(v_proj, "q8_0").blocks)
    assert torch.equal(int4.model.layers[1].self_attn.v_proj.blocks,
                       formats.quantize(v_proj, "q4_1").blocks)
    plain, report_none = load_gguf_model(path, quantization="none")
    assert dict(report_none.formats) == {"float": 15} and report_none.quantized_bytes == 0
    expected = _logits(_transformers_model(path))
    torch.testing.assert_close(_logits(plain), expected, rtol=1e-5, atol=1e-5)


def test_bf16_model(files: dict[str, Path]) -> None:
    model, _ = load_gguf_model(files["llama"], dtype=torch.bfloat16)
    assert model.model.norm.weight.dtype == torch.bfloat16
    logits = _logits(model)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_config_matches_transformers(files: dict[str, Path]) -> None:
    from transformers import AutoConfig

    for name in ("llama", "llama_tied", "qwen2", "qwen3"):
        path = files[name]
        gguf = GGUFFile(path)
        assert gguf_config_dict(gguf) is not None
        ours = load_gguf_config(gguf).to_dict()
        theirs = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
        ours.pop("_name_or_path", None)
        theirs.pop("_name_or_path", None)
        if name == "qwen3":  # the one fix: transformers leaves head_dim at its default
            assert (ours.pop("head_dim"), theirs.pop("head_dim")) == (32, 128)
        assert ours == theirs, name


def test_a_missing_tensor_is_named(files: dict[str, Path], tmp_path: Path) -> None:
    import gguf

    source = GGUFFile(files["llama"])
    broken = tmp_path / "broken.gguf"
    writer = gguf.GGUFWriter(str(broken), "llama")
    for key in ("llama.block_count", "llama.context_length", "llama.embedding_length",
                "llama.feed_forward_length", "llama.attention.head_count",
                "llama.attention.head_count_kv", "llama.vocab_size"):
        writer.add_uint32(key, int(source.metadata[key]))
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    for name, info in source.tensors.items():
        if name != "blk.1.ffn_up.weight":
            writer.add_tensor(name, np.array(source.raw(name)).reshape(-1).view(np.uint8)
                              .reshape(source.raw(name).shape), raw_dtype=info.ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSourceError, match="up_proj"):
        load_gguf_model(broken)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(40))
    with pytest.raises(GGUFFormatError):
        GGUFFile(bad)
    with pytest.raises(ModelSourceError, match="cannot read"):
        load_gguf_model(bad)


def test_quantized_weights_are_frozen_dataclasses(files: dict[str, Path]) -> None:
    model, _ = load_gguf_model(files["qwen2"])
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj.qweight, formats.QuantizedWeight)
    assert q_proj.bias is not None and q_proj.bias.dtype == torch.float32


def test_other_architectures_are_refused(tmp_path: Path) -> None:
    """transformers transforms some architectures' tensors on the way (MoE experts, reshaped
    projections...): the loader refuses a family ``langchain_ascend.families`` does not list
    rather than build a wrong model."""
    import gguf

    from langchain_ascend.engine.model_source.gguf_blocks import runs_gguf_blocks

    path = tmp_path / "starcoder2.gguf"
    writer = gguf.GGUFWriter(str(path), "starcoder2")
    writer.add_block_count(1)
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSourceError, match="quantization=None"):
        load_gguf_model(path)
    assert not runs_gguf_blocks("starcoder2") and runs_gguf_blocks("llama")
    assert runs_gguf_blocks("gemma3") and runs_gguf_blocks("phi3")
