"""``doctor --model``'s weights line: the format and bytes of a model's weights, as the engine
will hold them, read from the file's tensor table or the folder's files (no tensor is read).

For a GGUF file: the bytes per ggml type, and what ``quantization="auto"`` runs, the file's
own blocks (Q4_0 / Q4_1 / Q8_0 as they are, other block types re-quantized to the nearest
supported format, float tensors kept) or, for an architecture whose blocks the engine does not
run, a de-quantized float32 copy (4 bytes a weight). For an HF folder: its safetensors bytes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from langchain_ascend.app.doctor_checks import Finding
from langchain_ascend.quant.gguf_file import GGUFFile, GGUFFormatError
from langchain_ascend.quant.gguf_model import SUPPORTED_ARCHITECTURES, target_format

NAME = "model weights"


def _mb(num_bytes: float) -> str:
    return f"{num_bytes / 1e6:.1f} MB"


def gguf_weights(path: Path) -> Finding:
    """The weights line of a GGUF file."""
    try:
        gguf = GGUFFile(path)
    except (GGUFFormatError, OSError) as exc:
        return Finding(NAME, "fail", f"cannot read {path}: {exc}",
                       "pass a complete .gguf model file")
    by_type: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    for info in gguf.tensors.values():
        by_type[info.type_name] += info.nbytes
        if len(info.shape) == 2:  # a linear or embedding weight
            runs[target_format(info.ggml_type, "gguf") or "float"] += 1
    total = sum(by_type.values())
    stored = ", ".join(f"{name} {_mb(size)}" for name, size in by_type.most_common())
    if gguf.architecture not in SUPPORTED_ARCHITECTURES:
        elements = sum(_elements(info.shape) for info in gguf.tensors.values())
        return Finding(NAME, "warn", f"{path.name}: {_mb(total)} in the file ({stored}); "
                       f"the engine does not run {gguf.architecture!r} blocks: "
                       f"quantization='auto' de-quantizes it to float32, {_mb(4 * elements)}",
                       "expect the float32 size in memory, or use a GGUF of "
                       + "/".join(sorted(SUPPORTED_ARCHITECTURES)))
    plan = ", ".join(f"{fmt} x{count}" for fmt, count in runs.most_common())
    return Finding(NAME, "ok", f"{path.name}: {_mb(total)} in the file ({stored}); "
                   f"quantization='auto' runs the file's own blocks (2-D weights: {plan})")


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def folder_weights(folder: Path) -> Finding:
    """The weights line of an HF folder (its safetensors / bin files)."""
    files = sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])
    if not files:
        return Finding(NAME, "skip", f"{folder}: no weight files (safetensors or bin)")
    total = sum(file.stat().st_size for file in files)
    return Finding(NAME, "ok", f"{folder.name}: {_mb(total)} in {len(files)} file(s); float "
                   "weights (quantization='int8' / 'int4' quantizes them at load)")


def check_model_weights(model: str) -> Finding:
    """The weights line of ``--model``: a ``.gguf`` file, or an HF folder (or one holding a
    single GGUF file)."""
    path = Path(model).expanduser()
    if path.is_file():
        return gguf_weights(path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1 and not (path / "config.json").is_file():
            return gguf_weights(ggufs[0])
        return folder_weights(path)
    return Finding(NAME, "fail", f"{model} does not exist",
                   "pass a model folder or a .gguf file")
