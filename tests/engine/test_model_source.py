"""Model sources: local folders pass through, GGUF files are checked and converted once (then
cached), hub ids resolve through the local HF cache, and every bad source is a
``ModelSourceError`` naming the path. The conversion itself is replaced by a counting fake here
(the real one runs in ``integration_tests/test_smollm2_source.py``)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from langchain_core.messages import HumanMessage

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from langchain_ascend.engine import model_source  # noqa: E402
from langchain_ascend.engine.model_source import (  # noqa: E402
    ResolvedModel,
    check_model_source,
    gguf_cache,
    gguf_convert,
    inspect_gguf,
    resolve_model_source,
)
from langchain_ascend.errors import LangChainAscendError, ModelSourceError  # noqa: E402
from langchain_ascend.testing import needs_smollm2, smollm2_gguf_path  # noqa: E402


def write_gguf(path: Path, arch: str = "llama", *, tokenizer: bool = True,
               tensor_values: float = 1.0) -> Path:
    """A tiny but well-formed GGUF file: metadata, a vocabulary, two float32 tensors."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(64)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["<unk>", "<s>", "</s>", "a", "b"])
    writer.add_tensor("token_embd.weight", np.full((5, 8), tensor_values, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_VOCAB = ["<unk>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "ab"]
TINY_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def write_tiny_llama(path: Path, *, drop: str | None = None, eos_token: str = "<|im_end|>",
                     hidden: int = 8, ffn: int = 16, heads: int = 2, kv_heads: int = 1,
                     chat_template: str | None = TINY_TEMPLATE) -> Path:
    """A complete 1-layer llama GGUF (float32 tensors, gpt2-style vocabulary, ChatML-ish
    template) that transformers converts in a second; ``drop`` leaves one tensor out,
    ``chat_template=None`` writes no ``tokenizer.chat_template`` (a base model's file)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(len(TINY_VOCAB))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TINY_VOCAB)
    writer.add_token_types([3, 3, 3, 1, 1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(TINY_VOCAB.index(eos_token))
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    head_dim = hidden // heads
    shapes = {"token_embd.weight": (len(TINY_VOCAB), hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.attn_q.weight": (hidden, hidden),
              "blk.0.attn_k.weight": (kv_heads * head_dim, hidden),
              "blk.0.attn_v.weight": (kv_heads * head_dim, hidden),
              "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_norm.weight": (hidden,),
              "blk.0.ffn_gate.weight": (ffn, hidden), "blk.0.ffn_up.weight": (ffn, hidden),
              "blk.0.ffn_down.weight": (hidden, ffn)}
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        if name != drop:
            writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class FakeConverter:
    """Stands in for ``_convert_gguf``: counts calls, writes a minimal HF folder."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[Path] = []
        self.delay = delay
        self._lock = threading.Lock()

    def __call__(self, gguf_path: Path, out_dir: Path, *, progress: bool) -> None:
        with self._lock:
            self.calls.append(gguf_path)
        time.sleep(self.delay)
        (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (out_dir / "model.safetensors").write_bytes(b"fake")


@pytest.fixture
def fake_convert(monkeypatch) -> FakeConverter:
    fake = FakeConverter()
    monkeypatch.setattr(gguf_cache, "convert_gguf", fake)
    return fake


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(model_source.CACHE_ENV_VAR, str(root))
    return root


def assert_source_error(call, *needles: str) -> ModelSourceError:
    with pytest.raises(ModelSourceError) as info:
        call()
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    return info.value


# ------------------------------------------------------------------ bad sources


def test_error_type_is_ours_and_a_value_error():
    assert issubclass(ModelSourceError, LangChainAscendError)
    assert issubclass(ModelSourceError, ValueError)


@pytest.mark.parametrize("check", [resolve_model_source, check_model_source])
def test_missing_path_is_named(tmp_path, check):
    missing = tmp_path / "no" / "such-model"
    assert_source_error(lambda: check(missing), str(missing), "does not exist")
    assert_source_error(lambda: check(str(tmp_path / "gone.gguf")), "gone.gguf", "does not exist")


@pytest.mark.parametrize("bad", [42, None, "", "   "])
def test_non_path_values_are_rejected(bad):
    assert_source_error(lambda: check_model_source(bad), repr(bad) if bad is not None else "None")


def test_empty_folder(tmp_path):
    assert_source_error(lambda: resolve_model_source(tmp_path), str(tmp_path),
                        "neither config.json nor a .gguf file", "nothing")


def test_folder_with_a_random_file_and_no_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(os.urandom(256))
    assert_source_error(lambda: check_model_source(tmp_path), str(tmp_path), "weights.bin",
                        "neither config.json nor a .gguf file")


def test_folder_with_config_but_no_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert_source_error(lambda: check_model_source(tmp_path), str(tmp_path), "no weights")


def test_random_bytes_gguf(tmp_path):
    path = tmp_path / "random.gguf"
    path.write_bytes(os.urandom(4096))
    assert_source_error(lambda: check_model_source(path), str(path), "not a GGUF file")
    assert_source_error(lambda: inspect_gguf(path), str(path), "magic")


def test_gguf_magic_then_garbage(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"GGUF" + os.urandom(4096))
    assert_source_error(lambda: check_model_source(path), str(path),
                        "not a readable GGUF file")


def test_empty_gguf_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.touch()
    assert_source_error(lambda: check_model_source(path), str(path))


def test_truncated_gguf_is_caught_wherever_it_is_cut(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    assert inspect_gguf(tmp_path / "whole.gguf").size == len(whole)
    # in the fixed header, inside the metadata, inside the tensor table, in the tensor data
    for cut in (10, 40, len(whole) // 2, len(whole) - 1):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(whole[:cut])
        assert_source_error(lambda p=path: check_model_source(p), str(path), "truncated")


@needs_smollm2()
def test_truncated_copy_of_the_real_smollm2_header(tmp_path):
    real = smollm2_gguf_path()
    for num_bytes in (64 << 10, 4 << 20):  # inside the vocabulary, inside the tensor data
        with open(real, "rb") as handle:
            head = handle.read(num_bytes)
        path = tmp_path / f"SmolLM2-head-{num_bytes}.gguf"
        path.write_bytes(head)
        assert_source_error(lambda p=path: check_model_source(p), str(path), "truncated")


def test_unsupported_architecture(tmp_path):
    path = write_gguf(tmp_path / "odd.gguf", arch="notanarch")
    assert inspect_gguf(path).architecture == "notanarch"
    error = assert_source_error(lambda: check_model_source(path), str(path), "'notanarch'",
                                "cannot load", "llama")
    assert "qwen2" in str(error)


def test_encoder_decoder_architecture_is_not_a_causal_lm(tmp_path):
    path = write_gguf(tmp_path / "t5.gguf", arch="t5")
    assert_source_error(lambda: check_model_source(path), str(path), "'t5'")


def test_gguf_without_a_tokenizer(tmp_path):
    path = write_gguf(tmp_path / "notok.gguf", tokenizer=False)
    assert_source_error(lambda: check_model_source(path), str(path), "no tokenizer")


def test_a_transformers_failure_is_wrapped(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")

    def broken(*args, **kwargs):
        raise KeyError("blk.0.attn_q.weight")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", broken)
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    out.mkdir()
    error = assert_source_error(lambda: gguf_convert.convert_gguf(path, out, progress=False),
                                str(path), "transformers could not convert", "KeyError")
    assert isinstance(error.__cause__, KeyError)


def test_a_gguf_missing_a_tensor_is_refused_not_filled_with_noise(tmp_path, cache):
    pytest.importorskip("accelerate")
    path = write_tiny_llama(tmp_path / "tiny.gguf", drop="blk.0.ffn_up.weight")
    assert_source_error(lambda: resolve_model_source(path, progress=False), str(path),
                        "model.layers.0.mlp.up_proj.weight", "missing keys")
    assert [p for p in (cache / "gguf").iterdir() if p.is_dir()] == []


def test_a_model_too_big_for_memory_is_refused_before_loading(tmp_path, cache, monkeypatch,
                                                               fake_convert):
    path = write_gguf(tmp_path / "tiny.gguf")  # 48 weights = 192 bytes in float32
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=100))
    assert_source_error(lambda: resolve_model_source(path, progress=False), str(path),
                        "GiB", "memory")
    assert fake_convert.calls == []


def test_real_conversion_of_a_tiny_llama_gguf(tmp_path, cache):
    """The real converter end to end on a 1-layer llama: an HF folder with the weights as
    written, the chat template, and ``<|im_end|>`` as EOS everywhere."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = write_tiny_llama(tmp_path / "tiny.gguf", eos_token="b")
    resolved = resolve_model_source(path, progress=False)
    folder = resolved.path
    config = AutoConfig.from_pretrained(folder)
    assert getattr(config, "quantization_config", None) is None
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 1, 8)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    expected = gguf.GGUFReader(str(path)).get_tensor(0)
    assert expected.name == "token_embd.weight"
    torch.testing.assert_close(model.model.embed_tokens.weight,
                               torch.from_numpy(np.array(expected.data)))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == TINY_TEMPLATE
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the GGUF's EOS is "b"; the template's end-of-turn token is added to stop on
    eos = GenerationConfig.from_pretrained(folder).eos_token_id
    assert eos == [tokenizer.convert_tokens_to_ids("b"), im_end]
    assert json.loads((folder / "source.json").read_text())["architecture"] == "llama"


def test_a_gguf_without_a_chat_template_answers_with_chat_template_arg(tmp_path, cache):
    """A base model's GGUF (no ``tokenizer.chat_template``): the chat model's error names
    ``chat_template=``; given one, it answers and stops at the template's end-of-turn token
    although the file's EOS is another token."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from langchain_ascend.chat_models import AscendChatModel
    from langchain_ascend.errors import ChatTemplateError

    path = write_tiny_llama(tmp_path / "base.gguf", eos_token="b", chat_template=None)
    assert not inspect_gguf(path).has_chat_template
    settings = {"model": str(path), "device": "cpu", "temperature": 0, "max_tokens": 4}
    with pytest.raises(ChatTemplateError, match="pass chat_template= "):
        AscendChatModel(**settings).invoke("ab")
    template = TINY_TEMPLATE + "{% if add_generation_prompt %}<|im_start|>{% endif %}"
    template_file = tmp_path / "tiny.jinja"
    template_file.write_text(template, encoding="utf-8")
    for given in (template, str(template_file)):
        llm = AscendChatModel(**settings, chat_template=given)
        prepared = llm._prepare([HumanMessage("ab")], None, {})
        im_start, im_end = TINY_VOCAB.index("<|im_start|>"), TINY_VOCAB.index("<|im_end|>")
        assert prepared.prompt_token_ids[0] == im_start
        assert prepared.prompt_token_ids[-1] == im_start
        assert prepared.params.stop_token_ids == [im_end]
        assert im_end not in prepared.engine.eos_token_ids  # the file's EOS is "b"
        reply = llm.invoke("ab")
        assert reply.usage_metadata["output_tokens"] >= 1


def test_several_ggufs_without_a_pick_lists_them(tmp_path):
    write_gguf(tmp_path / "m.Q4_0.gguf")
    write_gguf(tmp_path / "m.Q8_0.gguf")
    assert_source_error(lambda: check_model_source(tmp_path), str(tmp_path), "m.Q4_0.gguf",
                        "m.Q8_0.gguf", "gguf_file=")
    assert_source_error(lambda: check_model_source(tmp_path, gguf_file="m.F16.gguf"),
                        "m.F16.gguf", "m.Q4_0.gguf", "m.Q8_0.gguf")


def test_gguf_file_naming_another_file_than_model(tmp_path):
    path = write_gguf(tmp_path / "a.gguf")
    assert_source_error(lambda: check_model_source(path, gguf_file="b.gguf"), "b.gguf")


def test_a_non_gguf_file(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("hello")
    assert_source_error(lambda: check_model_source(path), str(path), "not a GGUF file")


# ------------------------------------------------------------------ hub ids


def test_hub_id_offline_miss(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    for call in (check_model_source, resolve_model_source):
        assert_source_error(lambda c=call: c("no-such-org/no-such-model"),
                            "'no-such-org/no-such-model'",
                            "not in the local Hugging Face cache", "offline mode is on")


def test_transformers_offline_counts_as_offline(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    assert_source_error(lambda: resolve_model_source("org/model"), "offline mode is on")


def _fake_hub_cache(root: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """The HF cache layout: models--org--name/refs/main -> snapshots/<commit>/files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    return snapshot


def test_hub_id_offline_hit_is_the_cached_snapshot(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    snapshot = _fake_hub_cache(tmp_path / "hf", "some-org/chat-model",
                               {"config.json": b"{}", "model.safetensors": b"x"})
    assert check_model_source("some-org/chat-model") == "hub"
    resolved = resolve_model_source("some-org/chat-model")
    assert resolved == ResolvedModel(path=snapshot, kind="hub", source="some-org/chat-model")


def test_hub_snapshot_of_gguf_files_is_converted(monkeypatch, tmp_path, cache, fake_convert):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    data = write_gguf(tmp_path / "src.gguf").read_bytes()
    snapshot = _fake_hub_cache(tmp_path / "hf", "org/m-GGUF",
                               {"m.Q4_0.gguf": data, "m.Q8_0.gguf": data})
    resolved = resolve_model_source("org/m-GGUF", gguf_file="m.Q8_0.gguf", progress=False)
    assert resolved.kind == "gguf" and resolved.gguf_file == snapshot / "m.Q8_0.gguf"
    assert fake_convert.calls == [snapshot / "m.Q8_0.gguf"]


# ------------------------------------------------------------------ good sources, cache


def test_hf_folder_passes_through_unchanged(tmp_path, fake_convert):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert check_model_source(tmp_path) == "folder"
    resolved = resolve_model_source(str(tmp_path))
    assert resolved == ResolvedModel(path=tmp_path.resolve(), kind="folder",
                                     source=str(tmp_path))
    assert fake_convert.calls == []


def test_tiny_model_folder_passes_through(tiny_qwen2_path):
    resolved = resolve_model_source(tiny_qwen2_path)
    assert resolved.path == Path(tiny_qwen2_path).resolve() and resolved.kind == "folder"


def test_gguf_is_converted_once_then_cached(tmp_path, cache, fake_convert, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf")
    assert check_model_source(path) == "gguf"
    assert fake_convert.calls == []  # checking converts nothing
    first = resolve_model_source(path, progress=False)
    assert first.kind == "gguf" and first.gguf_file == path.resolve()
    assert first.source == str(path)
    assert first.path.parent == cache / "gguf" and (first.path / "config.json").is_file()
    manifest = json.loads((first.path / "source.json").read_text())
    assert manifest["sha256"] == model_source.file_sha256(path)
    assert manifest["architecture"] == "llama"

    hashed: list[Path] = []
    real_hash = gguf_cache.file_sha256
    monkeypatch.setattr(gguf_cache, "file_sha256",
                        lambda p, **kw: hashed.append(p) or real_hash(p, **kw))
    second = resolve_model_source(path, progress=False)
    assert second == first
    assert len(fake_convert.calls) == 1  # not converted again
    assert hashed == []  # unchanged (size, mtime, inode): not even re-hashed


def test_changed_file_gets_a_new_key(tmp_path, cache, fake_convert):
    path = write_gguf(tmp_path / "tiny.gguf", tensor_values=1.0)
    first = resolve_model_source(path, progress=False)
    stat = path.stat()
    write_gguf(path, tensor_values=2.0)  # same size, other bytes
    assert path.stat().st_size == stat.st_size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = resolve_model_source(path, progress=False)
    assert second.path != first.path and second.path.is_dir() and first.path.is_dir()
    assert len(fake_convert.calls) == 2
    # the same content elsewhere (a copy) hits the first key again: keyed by content
    copy = tmp_path / "copy" / "tiny.gguf"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    assert resolve_model_source(copy, progress=False).path == second.path
    assert len(fake_convert.calls) == 2


def test_key_carries_the_transformers_version(tmp_path, cache, fake_convert, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf")
    first = resolve_model_source(path, progress=False)
    assert "-tf" in first.path.name
    real_version = gguf_cache.package_version
    monkeypatch.setattr(gguf_cache, "package_version",
                        lambda name: "99.0" if name == "transformers" else real_version(name))
    second = resolve_model_source(path, progress=False)
    assert second.path != first.path and second.path.name.endswith("-tf99.0-v1")
    assert len(fake_convert.calls) == 2


def test_broken_index_is_ignored(tmp_path, cache, fake_convert):
    path = write_gguf(tmp_path / "tiny.gguf")
    first = resolve_model_source(path, progress=False)
    (cache / "gguf" / "index.json").write_text("{not json")
    assert resolve_model_source(path, progress=False) == first
    assert len(fake_convert.calls) == 1
    assert json.loads((cache / "gguf" / "index.json").read_text())["files"]


def test_incomplete_cache_folder_is_rebuilt(tmp_path, cache, fake_convert):
    path = write_gguf(tmp_path / "tiny.gguf")
    first = resolve_model_source(path, progress=False)
    (first.path / "source.json").unlink()
    again = resolve_model_source(path, progress=False)
    assert again.path == first.path and (again.path / "source.json").is_file()
    assert len(fake_convert.calls) == 2


def test_folder_with_one_gguf_and_a_pick_over_config(tmp_path, cache, fake_convert):
    write_gguf(tmp_path / "only.gguf")
    assert resolve_model_source(tmp_path, progress=False).gguf_file == tmp_path / "only.gguf"
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert resolve_model_source(tmp_path).kind == "folder"  # config.json wins without a pick
    picked = resolve_model_source(tmp_path, gguf_file="only.gguf", progress=False)
    assert picked.kind == "gguf" and picked.gguf_file == tmp_path / "only.gguf"


def test_failed_conversion_leaves_nothing_behind(tmp_path, cache, monkeypatch):
    def failing(gguf_path, out_dir, *, progress):
        (out_dir / "partial.bin").write_bytes(b"half")
        raise ModelSourceError(f"conversion of {gguf_path} failed")

    monkeypatch.setattr(gguf_cache, "convert_gguf", failing)
    path = write_gguf(tmp_path / "tiny.gguf")
    assert_source_error(lambda: resolve_model_source(path, progress=False), str(path))
    leftovers = [p.name for p in (cache / "gguf").iterdir()
                 if p.is_dir()]
    assert leftovers == []


def test_concurrent_resolves_convert_once(tmp_path, cache, monkeypatch):
    fake = FakeConverter(delay=0.3)
    monkeypatch.setattr(gguf_cache, "convert_gguf", fake)
    path = write_gguf(tmp_path / "tiny.gguf")
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(
        resolve_model_source(path, progress=False).path)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 4 and len(set(results)) == 1
    assert len(fake.calls) == 1


def test_cache_dir_argument_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(model_source.CACHE_ENV_VAR, str(tmp_path / "env"))
    assert model_source.gguf_cache_dir() == (tmp_path / "env" / "gguf").resolve()
    assert model_source.gguf_cache_dir(tmp_path / "arg") == (tmp_path / "arg" / "gguf").resolve()
    monkeypatch.delenv(model_source.CACHE_ENV_VAR)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert model_source.gguf_cache_dir() == (
        Path("~/.cache/langchain_ascend/gguf").expanduser().resolve())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_source.gguf_cache_dir() == (tmp_path / "xdg" / "langchain_ascend/gguf").resolve()


def test_cache_variable_is_the_testing_one():
    from langchain_ascend.cache_dir import CACHE_ENV_VAR as ROOT_VAR
    from langchain_ascend.testing.cache import CACHE_ENV_VAR

    assert model_source.CACHE_ENV_VAR == CACHE_ENV_VAR == ROOT_VAR


def test_inspect_reads_the_header(tmp_path):
    info = inspect_gguf(write_gguf(tmp_path / "tiny.gguf", arch="qwen2"))
    assert (info.architecture, info.name, info.num_tensors, info.version) == (
        "qwen2", "tiny qwen2", 2, 3)
    assert info.has_tokenizer and not info.has_chat_template
    assert "tokenizer.ggml.tokens" in info.metadata_keys


@needs_smollm2()
def test_smollm2_header_and_architecture_check():
    info = inspect_gguf(smollm2_gguf_path())
    assert info.architecture == "llama" and info.num_tensors == 272
    assert info.has_tokenizer and info.has_chat_template
    assert check_model_source(smollm2_gguf_path()) == "gguf"
    assert "llama" in model_source.supported_gguf_architectures()
