"""Random-weight tiny models: real loading path, shapes, determinism, architectures, presets."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from langchain_ascend import families
from langchain_ascend.testing import (
    ALL_ARCHITECTURES,
    ARCHITECTURES,
    GEMMA_SLIDING_WINDOW,
    PRESETS,
    build_model,
    create_model,
    make_config,
)

EXPECTED_CLASSES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _file_hashes(folder: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.is_file()
    }


@pytest.fixture(scope="module")
def loaded(tiny_model_paths):
    return {
        arch: (AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))
        for arch, path in tiny_model_paths.items()
    }


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_loads_through_auto_classes_and_gives_logits(loaded, arch) -> None:
    model, tokenizer = loaded[arch]
    assert type(model).__name__ == EXPECTED_CLASSES[arch]
    assert model.config.model_type == arch
    ids = tokenizer("The weather in Paris is", return_tensors="pt").input_ids  # (1, T)
    with torch.no_grad():
        logits = model(ids).logits  # (1, T, V)
    assert logits.shape == (1, ids.shape[1], PRESETS["tiny"].vocab_size)
    assert torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tokenizer_length_equals_model_vocab(loaded, arch) -> None:
    model, tokenizer = loaded[arch]
    assert len(tokenizer) == model.config.vocab_size == PRESETS["tiny"].vocab_size
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_shape_uses_grouped_query_attention(loaded, arch) -> None:
    config = loaded[arch][0].config
    preset = PRESETS["tiny"]
    assert config.num_key_value_heads == 2 < config.num_attention_heads == 4
    assert config.max_position_embeddings >= 4096
    assert config.hidden_size == preset.hidden_size
    k_proj = loaded[arch][0].model.layers[0].self_attn.k_proj
    assert k_proj.out_features == preset.num_key_value_heads * preset.head_dim
    total = sum(p.numel() for p in loaded[arch][0].parameters())
    assert 500_000 < total < 5_000_000


def test_only_qwen3_has_query_key_norms(loaded) -> None:
    for arch in ARCHITECTURES:
        attention = loaded[arch][0].model.layers[0].self_attn
        has_norms = hasattr(attention, "q_norm") and hasattr(attention, "k_norm")
        assert has_norms == (arch == "qwen3"), arch
    q_norm = loaded["qwen3"][0].model.layers[0].self_attn.q_norm
    assert q_norm.weight.shape == (PRESETS["tiny"].head_dim,)


def test_qwen2_ties_output_head_like_qwen25_and_llama_does_not(loaded) -> None:
    qwen2 = loaded["qwen2"][0]
    llama = loaded["llama"][0]
    assert qwen2.config.tie_word_embeddings
    assert qwen2.lm_head.weight.data_ptr() == qwen2.model.embed_tokens.weight.data_ptr()
    assert not llama.config.tie_word_embeddings
    assert not torch.equal(llama.lm_head.weight, llama.model.embed_tokens.weight)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_decoding_is_not_stuck_on_one_token(loaded, arch) -> None:
    model, tokenizer = loaded[arch]
    ids = tokenizer("The weather in Paris is", return_tensors="pt").input_ids  # (1, T)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
    new_tokens = out[0, ids.shape[1] :].tolist()
    assert len(set(new_tokens)) > 4


def test_same_seed_builds_identical_files_and_other_seed_other_weights(tmp_path) -> None:
    first = build_model("tiny", "qwen3", seed=0, cache_dir=tmp_path / "a")
    second = build_model("tiny", "qwen3", seed=0, cache_dir=tmp_path / "b")
    hashes = _file_hashes(first)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(
        hashes
    )
    assert hashes == _file_hashes(second)
    assert first.name == second.name

    reseeded = build_model("tiny", "qwen3", seed=1, cache_dir=tmp_path / "a")
    assert reseeded != first
    other_hashes = _file_hashes(reseeded)
    assert other_hashes["tokenizer.json"] == hashes["tokenizer.json"]
    assert other_hashes["model.safetensors"] != hashes["model.safetensors"]


def test_saved_weights_equal_a_seeded_in_memory_model(tiny_qwen2_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2_path)
    config = make_config(
        "tiny",
        "qwen2",
        endoftext_id=tokenizer.pad_token_id,
        im_end_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(1234)
    rng_before = torch.get_rng_state()
    fresh = create_model(config, seed=0).state_dict()
    assert torch.equal(torch.get_rng_state(), rng_before)
    saved = load_file(tiny_qwen2_path / "model.safetensors")
    assert saved
    for name, tensor in saved.items():
        assert torch.equal(fresh[name], tensor), name
    loaded = AutoModelForCausalLM.from_pretrained(tiny_qwen2_path).state_dict()
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name


def test_second_build_reuses_the_cached_folder(tiny_qwen2_path) -> None:
    weights = tiny_qwen2_path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = build_model("tiny", "qwen2", cache_dir=tiny_qwen2_path.parent)
    assert again == tiny_qwen2_path
    assert weights.stat().st_mtime_ns == before


def test_bench_preset_config_shape_and_size() -> None:
    config = make_config("bench", "qwen2", endoftext_id=32742, im_end_id=32744)
    assert (config.hidden_size, config.num_hidden_layers) == (512, 8)
    assert (config.num_attention_heads, config.num_key_value_heads) == (8, 2)
    assert config.vocab_size >= 32768
    assert config.max_position_embeddings >= 8192
    assert config.tie_word_embeddings
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    assert 30_000_000 < total < 50_000_000


def test_config_round_trips_through_auto_config(tiny_model_paths) -> None:
    for arch, path in tiny_model_paths.items():
        config = AutoConfig.from_pretrained(path)
        assert config.model_type == arch
        assert config.eos_token_id == AutoTokenizer.from_pretrained(path).eos_token_id


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preset": "huge"}, r"unknown preset 'huge'; valid: tiny, bench"),
        ({"arch": "gpt2"}, r"unknown arch 'gpt2'; valid: qwen2, llama, qwen3"),
    ],
)
def test_unknown_preset_or_arch_names_the_valid_ones(tmp_path, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(cache_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch", [a for a in ALL_ARCHITECTURES if a not in ARCHITECTURES])
def test_families_transformers_runs_build_with_their_shape(arch) -> None:
    """Gemma 3 / Gemma 2 / Phi-3: the family's model type, tie and (Gemma) sliding window;
    Gemma 3's six layers hold its layer pattern, five local and one global."""
    path = build_model("tiny", arch)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    family = families.by_architecture(arch)
    config = model.config
    assert family is not None and config.model_type == family.model_type
    assert bool(config.tie_word_embeddings) == family.tied_test_head
    assert config.vocab_size == len(AutoTokenizer.from_pretrained(path))
    if arch.startswith("gemma"):
        assert config.sliding_window == GEMMA_SLIDING_WINDOW
    if arch == "gemma3":
        assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    ids = torch.tensor([[5, 17, 300, 4000, 2, 99]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert len(set(out[0, ids.shape[1]:].tolist())) > 3
