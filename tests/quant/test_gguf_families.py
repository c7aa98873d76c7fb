"""Gemma 3, Gemma 2 and Phi-3 GGUF files run from their blocks in "gguf" mode.

Tiny random models of each family (``testing.build_model``) are written as llama.cpp lays
them out (``testing.gguf_writer``: Gemma's norms plus one, Phi-3's fused ``attn_qkv`` /
``ffn_up``) and loaded by ``quant.gguf_model`` and by transformers' own GGUF loader, which
de-quantizes (the reference). The engine and AscendChatModel run them through their owned
CPU models (``engine.cpu.models.gemma`` for Gemma 2/3, ``engine.cpu.models.llama`` for Phi-3)
over the file's blocks and say so in ``stats().weights["forward"]``; transformers' forward
over our quantized linears (the ``"row"`` layout, no fused products) gives the same values.
Gemma 2 soft-caps its attention logits in our paged attention (the torch paths and the native
kernels) and its final logits in the owned model's head.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from langchain_ascend import families
from langchain_ascend.engine.hook_types import PlainLogitsHead
from langchain_ascend.quant.embedding import QuantizedEmbedding
from langchain_ascend.quant.gguf_config import gguf_config_dict, load_gguf_config
from langchain_ascend.quant.gguf_file import GGUFFile
from langchain_ascend.quant.gguf_model import load_gguf_model
from langchain_ascend.quant.linear import QuantizedLinear, use_reference
from langchain_ascend.testing import GEMMA_SLIDING_WINDOW, build_model, write_gguf

ARCHS = ("gemma3", "phi3", "gemma2")
IDS = torch.tensor([list(range(5, 400, 13))])  # (1, 31): longer than Gemma's window
NATIVE_SHARE = 0.05
"""The native products (int8 activations, as llama.cpp's) stay within this share of the
largest logit of the de-quantized model's (measured ~0.02 on these files, as for Llama)."""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {arch: write_gguf(build_model("tiny", arch), root / f"{arch}.gguf") for arch in ARCHS}


def _transformers_model(path: Path, **config: object) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                dtype=torch.float32, **config).eval()


def _logits(model: nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits[0]  # (T, V)


def test_the_family_table_names_real_architectures() -> None:
    from gguf import MODEL_ARCH_NAMES
    from transformers import CONFIG_MAPPING

    for family in families.FAMILIES:
        assert family.gguf_architecture in MODEL_ARCH_NAMES.values(), family.name
        assert all(t in CONFIG_MAPPING for t in family.model_types), family.name
        assert families.by_architecture(family.gguf_architecture) is family
    assert families.by_model_type("mistral") is families.by_architecture("llama")
    assert families.owned_classes("llama") == {"LlamaModel", "MistralModel", "Qwen2Model",
                                               "Qwen3Model", "Phi3Model"}
    assert families.owned_classes("gemma") == {"Gemma2Model", "Gemma3TextModel"}
    assert families.owned_classes("gemma", "RMSNorm") == {"Gemma2RMSNorm", "Gemma3RMSNorm"}
    assert "gemma3_text" not in families.PLAIN_HEAD_MODEL_TYPES  # Gemma soft-caps its logits
    assert "gemma2" not in families.PLAIN_HEAD_MODEL_TYPES  # (final_logit_softcapping)
    assert families.by_architecture("gemma") is None  # Gemma 1: not in the table, refused


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers_gguf_loader(files: dict[str, Path], arch: str) -> None:
    """The file's blocks, de-quantized by the reference product, give transformers' logits
    (norms minus one, scaled embedding, fused projections, sliding windows, soft-capping);
    the native products come within :data:`NATIVE_SHARE`."""
    model, report = load_gguf_model(files[arch])
    assert report.requantized == [] and report.weight_format == "q4_1+q8_0"
    expected = _logits(_transformers_model(files[arch]))
    native = _logits(model)
    assert (native - expected).abs().max() < NATIVE_SHARE * expected.abs().max()
    assert use_reference(model) > 0
    torch.testing.assert_close(_logits(model), expected, rtol=1e-4, atol=1e-4)


def test_gemma3_blocks_norms_and_embedding_scale(files: dict[str, Path]) -> None:
    model, _ = load_gguf_model(files["gemma3"])
    gguf = GGUFFile(files["gemma3"])
    config = model.config
    assert config.model_type == "gemma3_text" and config.sliding_window == GEMMA_SLIDING_WINDOW
    assert config.layer_types.count("full_attention") == 1  # six layers: five local, one global
    layer = model.model.layers[0]
    q_proj = layer.self_attn.q_proj
    assert isinstance(q_proj, QuantizedLinear)  # Gemma's rows are not reordered
    assert np.array_equal(q_proj.blocks.numpy(), np.asarray(gguf.raw("blk.0.attn_q.weight")))
    for hf, name in ((layer.self_attn.q_norm, "blk.0.attn_q_norm.weight"),
                     (layer.pre_feedforward_layernorm, "blk.0.ffn_norm.weight"),
                     (model.model.norm, "output_norm.weight")):
        assert torch.equal(hf.weight, torch.from_numpy(gguf.floats(name)) - 1)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and embedding.scale == pytest.approx(
        config.hidden_size ** 0.5)
    assert isinstance(head, QuantizedLinear) and head.blocks.data_ptr() == embedding.blocks.data_ptr()


def test_phi3_fused_projections_are_the_file_blocks(files: dict[str, Path]) -> None:
    model, report = load_gguf_model(files["phi3"])
    gguf = GGUFFile(files["phi3"])
    layer = model.model.layers[1]
    for module, name in ((layer.self_attn.qkv_proj, "blk.1.attn_qkv.weight"),
                         (layer.mlp.gate_up_proj, "blk.1.ffn_up.weight")):
        assert isinstance(module, QuantizedLinear)
        assert np.array_equal(module.blocks.numpy(), np.asarray(gguf.raw(name)))
    config = model.config
    assert layer.self_attn.qkv_proj.out_features == (
        config.num_attention_heads + 2 * config.num_key_value_heads) * 32
    assert layer.mlp.gate_up_proj.out_features == 2 * config.intermediate_size
    assert dict(report.formats) == {"q4_1": 8, "q8_0": 1}  # 4 fused linears a layer, the head


@pytest.mark.parametrize("arch", ARCHS)
def test_config_from_the_metadata_is_transformers_config(files: dict[str, Path],
                                                         arch: str) -> None:
    from transformers import AutoConfig

    path = files[arch]
    gguf = GGUFFile(path)
    assert gguf_config_dict(gguf) is not None  # the fast route, no vocabulary decode
    ours = load_gguf_config(gguf).to_dict()
    theirs = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    ours.pop("_name_or_path", None)
    theirs.pop("_name_or_path", None)
    assert ours == theirs


ENGINE_ARCHS = ("gemma3", "phi3", "gemma2")


@pytest.fixture(scope="module")
def engines(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    from langchain_ascend.engine.llm_engine import LLMEngine
    from langchain_ascend.engine.model_source import resolve_model_source

    cache = tmp_path_factory.mktemp("cache")
    made = {}
    for arch in ENGINE_ARCHS:
        folder = resolve_model_source(files[arch], quantization="gguf", cache_dir=cache,
                                      progress=False).path
        made[arch] = LLMEngine(folder, device="cpu", dtype="float32", num_blocks=32,
                               block_size=16, max_num_batched_tokens=128,
                               kv_cache_dtype="float32")
    yield made
    for engine in made.values():
        engine.shutdown()


def _probe(runner, tokens: list[int], blocks: list[int], start: int = 0) -> torch.Tensor:
    """``(V,)`` logits of the last token from one packed step of ``runner`` computing
    ``tokens`` at positions ``start...`` (the earlier ones already in its cache): a prefill
    from 0, or a one-token decode step."""
    from langchain_ascend.engine.core.batch import ScheduledSegment
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    segment = ScheduledSegment("probe", tokens, start, blocks, True,
                               SamplingParams(max_tokens=1))
    _, logits = runner.forward_batch([segment])  # (1, V)
    return logits[0]


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_engine_runs_the_blocks_through_the_owned_model(
        engines, files: dict[str, Path], arch: str) -> None:
    """Default settings: the owned model over the native products (within
    :data:`NATIVE_SHARE`), the same greedy tokens as transformers' de-quantized model, prefill
    and decode steps alike."""
    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.cpu.models.gemma import GemmaModel
    from langchain_ascend.engine.cpu.models.llama import LlamaModel

    engine = engines[arch]
    weights = engine.stats().weights
    assert weights["quantization"] == "gguf" and weights["format"] == "q4_1+q8_0"
    assert weights["forward"] == families.NATIVE_FORWARD
    runner = engine.driver.runner
    owned = runner.hooks.owned_model
    assert isinstance(owned, LlamaModel if arch == "phi3" else GemmaModel)
    assert runner.hooks.changes["owned_layers"] == runner.model.config.num_hidden_layers
    if arch != "phi3":  # Gemma soft-caps its logits: the model's own head, never the screen
        assert isinstance(runner.logits_head, PlainLogitsHead)
        assert runner.hooks.changes["screened_greedy"] is False
    reference = _transformers_model(files[arch])
    expected = _logits(reference)[-1]
    prompt = IDS[0].tolist()
    logits = _probe(runner, prompt, [0, 1])
    assert (logits - expected).abs().max() < NATIVE_SHARE * expected.abs().max()
    out = engine.generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    with torch.inference_mode():
        greedy = reference.generate(IDS, max_new_tokens=8, do_sample=False)[0, len(prompt):]
    assert list(out.token_ids) == greedy.tolist()


def _reference_products(runner) -> int:
    """Put every quantized product the runner computes with -- transformers' modules and the
    owned model's fused products -- on the weights-only torch reference, and the owned
    Llama layer's decodes on the per-op path; returns how many products."""
    count = use_reference(runner.model)
    owned = runner.hooks.owned_model
    if owned is not None:
        for layer in owned.layers:
            for product in (layer.qkv, layer.o, layer.gate_up, layer.down):
                if isinstance(product, QuantizedLinear):
                    product.use_native = False
                    count += 1
        if getattr(owned, "stack", None) is not None:
            owned.stack.max_rows = 0
    return count


@pytest.mark.parametrize("layout", ["dual", "row"])
@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_engine_logits_are_transformers_within_float_tolerance(
        files: dict[str, Path], tmp_path: Path, arch: str, layout: str) -> None:
    """With the reference product the engine's steps -- the owned model (``"dual"``, the
    default) or transformers' forward over our quantized linears (``"row"``) -- give
    transformers' de-quantized logits to float rounding: a prefill of the prompt over the
    paged cache (Gemma 3's sliding windows, Gemma's norms, Phi-3's fused products), then
    greedy decode steps. The window matters at this prompt length (the same model attending
    everything is far off)."""
    from langchain_ascend.engine.model_source import resolve_model_source
    from langchain_ascend.engine.worker.model_runner import ModelRunner

    folder = resolve_model_source(files[arch], quantization="gguf", cache_dir=tmp_path,
                                  progress=False).path
    runner = ModelRunner.load(str(folder), device="cpu", dtype="float32", num_blocks=8,
                              block_size=16, kv_cache_dtype="float32", weight_layout=layout,
                              compile=False)
    assert runner.weights["forward"] == (families.NATIVE_FORWARD if layout == "dual"
                                         else families.TRANSFORMERS_FORWARD)
    assert _reference_products(runner) > 0
    reference = _transformers_model(files[arch])
    prompt = IDS[0].tolist()
    with torch.inference_mode():
        greedy = reference.generate(IDS, max_new_tokens=4, do_sample=False)[0].tolist()
        expected = reference(torch.tensor([greedy])).logits[0]  # (T + 4, V)
    logits = _probe(runner, prompt, [0, 1, 2])
    torch.testing.assert_close(logits, expected[len(prompt) - 1], rtol=1e-4, atol=1e-4)
    for position in range(len(prompt), len(greedy) - 1):  # decode steps
        logits = _probe(runner, [greedy[position]], [0, 1, 2], start=position)
        torch.testing.assert_close(logits, expected[position], rtol=1e-4, atol=1e-4)
    if arch != "phi3":
        unwindowed = _logits(_transformers_model(files[arch], sliding_window=4096))[-1]
        assert (unwindowed - expected[len(prompt) - 1]).abs().max() > 1e-2
    # Gemma 2's default caps (50, 30) barely touch this model's scores: the caps that matter
    # are tested in test_gemma2_soft_capping_in_prefill_and_decode_steps.


STRONG_CAPS = {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 0.5}
"""Gemma 2 caps the tiny model's scores feel (its defaults, 50 and 30, barely touch them)."""


@pytest.mark.parametrize("layout", ["dual", "row"])
@pytest.mark.parametrize("backend", ["cpu", "torch_ref"])
def test_gemma2_soft_capping_in_prefill_and_decode_steps(files: dict[str, Path],
                                                         backend: str, layout: str) -> None:
    """With caps that matter, the engine's prefill step (the prefill kernel / torch) and decode
    steps (the paged kernel / torch) give transformers' soft-capped logits to float rounding,
    and greedy decoding its tokens, through the owned model (``"dual"``) and transformers'
    forward (``"row"``); the uncapped model is far off."""
    from langchain_ascend.engine.core.batch import ScheduledSegment
    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.worker.model_runner import ModelRunner

    path = files["gemma2"]
    config = load_gguf_config(GGUFFile(path))
    for field, cap in STRONG_CAPS.items():
        setattr(config, field, cap)
    model, _ = load_gguf_model(path, config=config)
    runner = ModelRunner.from_model(model, num_blocks=8, block_size=16, kv_cache_dtype="float32",
                                    weight_layout=layout, compile=False, attention_backend=backend)
    assert (runner.hooks.owned_model is not None) == (layout == "dual")
    assert _reference_products(runner) > 0
    if backend == "cpu":
        assert runner.backend.paged_native and runner.backend.prefill_native
    reference = _transformers_model(path, **STRONG_CAPS)
    prompt = IDS[0].tolist()
    with torch.inference_mode():
        greedy = reference.generate(IDS, max_new_tokens=4, do_sample=False)[0].tolist()
        expected = reference(torch.tensor([greedy])).logits[0]  # (T + 4, V)
    plain = _logits(_transformers_model(path))
    assert (plain - expected[: len(prompt)]).abs().max() > 1e-1

    def step(tokens: list[int], start: int) -> torch.Tensor:
        segment = ScheduledSegment("g", tokens, start, [0, 1, 2], True,
                                   SamplingParams(max_tokens=1))
        return runner.forward_batch([segment])[1][0]  # (V,)

    logits = step(prompt[:-1], 0)  # prefill
    torch.testing.assert_close(logits, expected[len(prompt) - 2], rtol=1e-4, atol=1e-4)
    tokens = list(prompt)
    for position in range(len(prompt) - 1, len(greedy) - 1):  # decodes
        logits = step([greedy[position]], position)
        torch.testing.assert_close(logits, expected[position], rtol=1e-4, atol=1e-4)
        tokens.append(int(logits.argmax()))
    assert tokens == greedy


@pytest.mark.parametrize("arch", ["gemma3", "gemma2"])
def test_chat_model_generates_greedily_in_gguf_mode(files: dict[str, Path], arch: str) -> None:
    from langchain_ascend.chat_models import AscendChatModel

    chat = AscendChatModel(model=str(files[arch]), device="cpu", dtype="float32",
                           quantization="gguf", max_tokens=6, temperature=0.0)
    first = chat.invoke("The quick brown fox jumps over the lazy dog")
    again = chat.invoke("The quick brown fox jumps over the lazy dog")
    assert first.content and first.content == again.content
    assert first.usage_metadata is not None and 0 < first.usage_metadata["output_tokens"] <= 6


def test_int8_of_a_gemma3_folder_keeps_the_embedding_scale() -> None:
    """Quantizing an HF Gemma at load (``quantization="int8"``) replaces its scaled, tied
    embedding by blocks that keep the ``sqrt(hidden)`` scale."""
    from transformers import AutoModelForCausalLM

    from langchain_ascend.quant.quantize_model import quantize_model

    folder = build_model("tiny", "gemma3")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = _logits(model)
    quantize_model(model, "q8_0")
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, QuantizedEmbedding)
    assert embedding.scale == pytest.approx(model.config.hidden_size ** 0.5)
    # q8_0 weights and activations: ~4% of the largest logit here; without the scale ~36%
    assert (_logits(model) - expected).abs().max() < 0.1 * expected.abs().max()


def test_a_native_family_says_native(tmp_path: Path) -> None:
    from langchain_ascend.engine.model_source import resolve_model_source
    from langchain_ascend.engine.worker.model_runner import ModelRunner

    path = write_gguf(build_model("tiny", "llama"), tmp_path / "llama.gguf")
    folder = resolve_model_source(path, quantization="gguf", cache_dir=tmp_path / "cache",
                                  progress=False).path
    runner = ModelRunner.load(str(folder), device="cpu", dtype="float32", num_blocks=8,
                              block_size=16, compile=False)
    assert runner.hooks.owned_model is not None
    assert runner.weights["forward"] == families.NATIVE_FORWARD


def test_what_transformers_drops_is_named(files: dict[str, Path], tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """A Phi-3 file with longrope factor tensors and a partial rotary width (Phi-4-mini's):
    transformers' loader builds full rotary without the factors, so does ours, and says so."""
    import gguf

    from langchain_ascend.quant.gguf_config import dropped_by_transformers

    assert all(dropped_by_transformers(GGUFFile(path)) == [] for path in files.values())
    path = tmp_path / "phi4ish.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_embedding_length(128)
    writer.add_head_count(4)
    writer.add_rope_dimension_count(24)
    writer.add_tensor("rope_factors_long.weight", np.ones(12, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dropped = dropped_by_transformers(GGUFFile(path))
    assert dropped == ["rope_factors_long.weight", "rope.dimension_count 24 < head size 32"]
    with caplog.at_level("WARNING"):
        load_gguf_config(GGUFFile(path))
    assert "rope_factors_long.weight" in caplog.text
