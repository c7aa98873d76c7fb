"""doctor --model's weights line: format and bytes read from a GGUF tensor table (each ggml
type, what quantization='auto' runs) or an HF folder's files, without reading tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from langchain_ascend.app import doctor  # noqa: E402
from langchain_ascend.app.doctor_weights import check_model_weights  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from gguf_fixtures import write_gguf  # noqa: E402


def _tiny_gguf(path: Path, arch: str = "llama") -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("blk.0.attn_q.weight",
                      gguf.quants.quantize(np.ones((64, 64), np.float32),
                                           gguf.GGMLQuantizationType.Q4_1),
                      raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.ffn_down.weight",
                      gguf.quants.quantize(np.ones((64, 64), np.float32),
                                           gguf.GGMLQuantizationType.Q5_1),
                      raw_dtype=gguf.GGMLQuantizationType.Q5_1)
    writer.add_tensor("token_embd.weight", np.ones((64, 64), dtype=np.float16))
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_file_reports_bytes_per_type_and_the_blocks_it_runs(tmp_path) -> None:
    finding = check_model_weights(str(_tiny_gguf(tmp_path / "m.gguf")))
    assert finding.status == "ok"
    # Q4_1 2560 bytes, Q5_1 3072, F16 8192, F32 256: 14080 bytes
    assert "m.gguf: 0.0 MB in the file (F16 0.0 MB, Q5_1 0.0 MB, Q4_1 0.0 MB" in finding.detail
    # Q4_1 and Q5_1 run as they are, the F16 embedding kept in float
    assert "(2-D weights: q4_1 x1, q5_1 x1, float x1)" in finding.detail


def test_a_real_sized_gguf_counts_megabytes(tmp_path, tiny_model_paths) -> None:
    path = write_gguf(tiny_model_paths["llama"], tmp_path / "llama.gguf")
    finding = check_model_weights(str(path))
    size = sum(len(chunk) for chunk in [path.read_bytes()])
    reported = float(finding.detail.split(": ")[1].split(" MB")[0])
    assert finding.status == "ok" and 0.5 * size / 1e6 < reported <= size / 1e6 + 0.05


def test_an_architecture_the_engine_does_not_run_says_float32(tmp_path) -> None:
    finding = check_model_weights(str(_tiny_gguf(tmp_path / "g.gguf", arch="gemma")))
    assert finding.status == "warn" and "de-quantizes it to float32" in finding.detail


def test_a_folder_and_a_missing_path(tmp_path, tiny_qwen2_path) -> None:
    folder = check_model_weights(str(tiny_qwen2_path))
    assert folder.status == "ok" and "float weights" in folder.detail
    assert check_model_weights(str(tmp_path / "missing")).status == "fail"
    (tmp_path / "empty").mkdir()
    assert check_model_weights(str(tmp_path / "empty")).status == "skip"


def test_doctor_lists_it_when_a_model_is_given(tmp_path) -> None:
    findings = doctor.gather(device="cpu", model=str(_tiny_gguf(tmp_path / "m.gguf")))
    assert [f.status for f in findings if f.name == "model weights"] == ["ok"]
    assert not [f for f in doctor.gather(device="cpu") if f.name == "model weights"]
