"""The benchmark helpers that measure against llama.cpp: the shaped-file writer, the decode
floor's byte count and llama-perplexity's chunking, on tiny shapes (the real ones are GBs)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from langchain_ascend.testing import needs_smollm2

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_perplexity  # noqa: E402
import gguf_shapes  # noqa: E402
import membw  # noqa: E402

TINY = gguf_shapes.Shape("tiny", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128,
                         tied_embeddings=False)


@needs_smollm2()
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_random_file_has_the_shape_tokenizer_and_weight_scale(tmp_path, qtype):
    import gguf
    from gguf.quants import dequantize

    path = tmp_path / "tiny.gguf"
    gguf_shapes.write_random(TINY, qtype, path, seed=1)
    reader = gguf.GGUFReader(path)
    names = {t.name: t for t in reader.tensors}
    assert len(names) == 1 + 9 * TINY.layers + 2
    assert reader.fields["llama.attention.head_count_kv"].contents() == 2
    assert "tokenizer.chat_template" in reader.fields
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    assert vocab == 49152
    q = names["blk.1.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType[qtype]
    weights = dequantize(q.data, q.tensor_type)  # (64, 64)
    assert weights.shape == (64, 64)
    assert 0.015 < float(weights.std()) < 0.025 and abs(float(weights.mean())) < 0.005
    norm = names["blk.0.ffn_norm.weight"]
    assert np.all(norm.data == 1.0)
    step = membw.decode_step_bytes(path)
    embedding = int(names["token_embd.weight"].n_bytes)
    assert not step["tied_embeddings"]
    assert step["step_bytes"] == step["file_weight_bytes"] - embedding + embedding // vocab


def test_tensor_plan_ties_the_head_to_the_embedding():
    tied = gguf_shapes.Shape("t", 64, 1, 4, 2, 16, 128, tied_embeddings=True)
    names = [n for n, _ in gguf_shapes.tensor_plan(tied, 100)]
    assert "output.weight" not in names and names[0] == "token_embd.weight"
    shapes = dict(gguf_shapes.tensor_plan(TINY, 100))
    assert shapes["blk.0.attn_k.weight"] == (32, 64) and shapes["blk.0.ffn_down.weight"] == (64, 128)


def test_unknown_shape_or_type_is_refused():
    with pytest.raises(ValueError, match="shape"):
        gguf_shapes.shaped_gguf("llama-70b", "Q4_0")
    with pytest.raises(ValueError, match="type"):
        gguf_shapes.shaped_gguf("llama-1b", "IQ2_XS")


def test_chunks_replace_the_first_token_with_bos_and_score_second_halves():
    ids = list(range(10, 30))  # 20 tokens: 2 chunks of 8, 4 left over
    pieces = bench_perplexity.chunked(ids, 8, 5, bos=1)
    assert pieces == [[1, *range(11, 18)], [1, *range(19, 26)]]
    assert bench_perplexity.chunked(ids, 8, 1, bos=None) == [list(range(10, 18))]
    with pytest.raises(ValueError, match="at least"):
        bench_perplexity.chunked(ids, 16, 1, bos=None)

    vocab = 40
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(len(pieces), 8, vocab, generator=gen)
    by_piece = {tuple(p): table[i] for i, p in enumerate(pieces)}
    nll, count = bench_perplexity.score_second_halves(lambda p: by_piece[tuple(p)], pieces)
    expected = 0.0
    for i, piece in enumerate(pieces):
        for pos in range(4, 7):  # logits at ctx/2 .. ctx-2 predict the next token
            expected -= float(torch.log_softmax(table[i, pos].double(), -1)[piece[pos + 1]])
    assert count == 2 * 3
    assert math.isclose(nll, expected, rel_tol=1e-9)
