"""The owned model's weight tree (issue 34): a GGUF file of a Llama-style family loads on the
CPU without transformers' model classes, and runs bit for bit as when transformers' skeleton
held the same blocks; its rotary frequencies are transformers'."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from langchain_ascend import families
from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu.models import llama_weights
from langchain_ascend.engine.cpu.models.llama_weights import LlamaWeights, folder_config
from langchain_ascend.engine.model_source import resolve_model_source
from langchain_ascend.engine.worker import model_runner
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.errors import ModelSourceError
from langchain_ascend.testing import build_model, needs_native_kernels, write_gguf

GREEDY = SamplingParams(max_tokens=4)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("owned")
    made = {}
    for arch in ("llama", "qwen2", "qwen3"):
        path = write_gguf(build_model("tiny", arch), root / f"{arch}.gguf")
        made[arch] = resolve_model_source(path, quantization="gguf", cache_dir=root / "cache",
                                          progress=False).path
    return made


def _steps(runner: ModelRunner) -> list[torch.Tensor]:
    """Logits of a prefill, then of a decode step after it."""
    prompt = list(range(5, 300, 7))  # 43 tokens
    first = runner.forward_batch([ScheduledSegment("a", prompt, 0, [0, 1, 2, 3], True,
                                                   GREEDY)])[1]
    then = runner.forward_batch([ScheduledSegment("a", [9], len(prompt), [0, 1, 2, 3], True,
                                                  GREEDY)])[1]
    return [first, then]


def _load(folder: Path, dtype: str = "float32") -> ModelRunner:
    return ModelRunner.load(str(folder), device="cpu", dtype=dtype, num_blocks=16,
                            block_size=16)


@needs_native_kernels()
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_the_tree_runs_as_transformers_skeleton_did(folders, arch, dtype, monkeypatch):
    owned = _load(folders[arch], dtype)
    assert isinstance(owned.model, LlamaWeights)
    assert owned.hooks.owned_model is not None
    assert owned.weights["forward"] == families.NATIVE_FORWARD
    with monkeypatch.context() as patch:  # the same file through transformers' skeleton
        patch.setattr(model_runner, "owned_gguf_config", lambda *args, **kwargs: None)
        skeleton = _load(folders[arch], dtype)
    assert type(skeleton.model).__name__.endswith("ForCausalLM")
    for got, want in zip(_steps(owned), _steps(skeleton), strict=True):
        assert torch.equal(got, want)


def test_other_settings_and_folders_get_transformers_classes(folders, tiny_model_paths):
    config = folder_config(folders["qwen3"])
    assert config is not None and config.model_type == "qwen3"
    assert folder_config(tiny_model_paths["llama"]) is None  # an HF folder: its own classes
    kwargs = dict(device=torch.device("cpu"), dtype=torch.float32, attention_backend="auto",
                  weight_layout="auto", compile="auto")
    for change in ({"compile": True}, {"attention_backend": "torch_ref"},
                   {"weight_layout": "row"}, {"dtype": torch.float16},
                   {"device": torch.device("meta")}):
        assert llama_weights.owned_gguf_config(folders["llama"], **{**kwargs, **change}) is None
    runner = ModelRunner.load(str(folders["llama"]), device="cpu", num_blocks=8,
                              block_size=16, compile=True)
    assert not isinstance(runner.model, LlamaWeights)  # compile=True needs the HF forward


def test_the_tree_has_no_forward_and_says_so(folders):
    runner = _load(folders["llama"])
    with pytest.raises(RuntimeError, match="owned CPU model"):
        runner.model(torch.tensor([[1, 2]]))


def test_a_tree_the_owned_model_cannot_take_loads_through_transformers(folders, monkeypatch,
                                                                       caplog):
    from langchain_ascend.engine.cpu.models.llama import LlamaModel

    tree = llama_weights.LlamaWeights(folder_config(folders["llama"]))
    monkeypatch.setattr(LlamaModel, "build", lambda *args: None)
    with pytest.raises(ModelSourceError, match="owned CPU model"):  # a typed error ...
        ModelRunner.from_model(tree)
    runner = _load(folders["llama"])  # ... on which the loader falls back
    assert not isinstance(runner.model, LlamaWeights) and runner.hooks.owned_model is None
    assert "through transformers' model class" in caplog.text


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}])
def test_rotary_frequencies_are_transformers(rope):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64,
                         max_position_embeddings=131072, rope_parameters=rope)
    want = LlamaRotaryEmbedding(config).inv_freq
    assert torch.equal(llama_weights.inv_freq(config), want)
    assert llama_weights.applies(config)
    assert not llama_weights.applies(LlamaConfig(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}))


def test_a_gguf_chat_model_loads_without_transformers_model_modules(folders):
    code = (
        "import sys\n"
        "from langchain_ascend.engine.llm_engine import LLMEngine\n"
        f"engine = LLMEngine({str(folders['qwen2'])!r}, device='cpu', num_blocks=8,"
        " block_size=16)\n"
        "engine.shutdown()\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('transformers.models.'))\n"
        "print(loaded)\n"
        "assert not any(m.endswith(('modeling_qwen2', 'configuration_qwen2')) for m in loaded)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
