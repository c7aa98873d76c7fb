"""AscendFAISS vs langchain_community FAISS (plus raw faiss and plain torch), one process.

Data: clustered synthetic embeddings, realistic for sentence-embedding corpora: ``--topics``
random topic directions, each document = its topic + Gaussian noise (per-topic spread), then
L2-normalised (MiniLM-style unit vectors). Queries are fresh draws from the same mixture.
Default 100,000 x 384 float32, 256 queries, k = 10, Euclidean (squared L2) as lc's default.

Measured (each side warmed up; single-query loops run ``--rounds`` times interleaved, best
kept, over ``--single-queries`` queries through the public by-vector API with a Python list
per query, as a retriever would):

* lc FAISS single-query q/s (``similarity_search_with_score_by_vector``) - the peer;
* raw faiss ``IndexFlatL2.search`` batched; plain torch matmul + topk single and batched;
* AscendFAISS flat: single-query q/s, batched q/s (``similarity_search_with_score_by_vectors``
  on all queries), recall@k against a float64 brute force;
* AscendFAISS IVF (``index_type="ivf"``): training time, single-query q/s, recall@k.

Bars (from the issue): flat single >= 1.3x lc single; flat batched >= 20x lc single; flat
recall@10 = 1.0; IVF single >= 10x lc single at recall@10 >= 0.95.

Run: ``python benchmarks/bench_vectorstore.py`` (``--quick`` for a 20k smoke run).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from typing import Any

import numpy as np
import torch
from langchain_core.embeddings import Embeddings

from langchain_ascend import AscendFAISS


class NoEmbeddings(Embeddings):
    """Placeholder: the benchmark searches by vector only."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise RuntimeError("by-vector benchmark")

    def embed_query(self, text: str) -> list[float]:
        raise RuntimeError("by-vector benchmark")


def clustered_corpus(num: int, dim: int, topics: int, seed: int) -> np.ndarray:
    """Unit vectors drawn from a mixture of ``topics`` spread-out clusters."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(topics, dim)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    spread = rng.uniform(0.04, 0.09, size=topics).astype(np.float32)  # per-topic noise
    labels = rng.integers(0, topics, size=num)
    out = centers[labels] + rng.normal(size=(num, dim)).astype(np.float32) * spread[labels, None]
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out.astype(np.float32)


def brute_force_topk(corpus: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Exact squared-L2 top-k in float64 (the recall reference)."""
    data = torch.from_numpy(corpus).double()
    q = torch.from_numpy(queries).double()
    dist = (q * q).sum(1, keepdim=True) - 2 * q @ data.T + (data * data).sum(1)
    return dist.topk(k, dim=1, largest=False).indices.numpy()


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(f) & set(t)) / k for f, t in zip(found, truth.tolist(),
                                                                     strict=True)]))


def qps(fn: Any, count: int) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def single_loop(search: Any, queries: list[list[float]], k: int) -> Any:
    def run() -> None:
        for q in queries:
            search(q, k=k)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-vectors", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--single-queries", type=int, default=64)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true", help="20k vectors, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.num_vectors, args.rounds, args.nlist, args.topics = 20_000, 1, 256, 200

    import faiss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.docstore.in_memory import InMemoryDocstore
        from langchain_community.vectorstores import FAISS

    k, n, dim = args.k, args.num_vectors, args.dim
    corpus = clustered_corpus(n, dim, args.topics, seed=0)
    rng = np.random.default_rng(1)
    picks = corpus[rng.integers(0, n, size=args.queries)]
    queries = picks + rng.normal(size=picks.shape).astype(np.float32) * 0.05
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    query_lists = queries.tolist()
    single = query_lists[: args.single_queries]
    texts = [f"doc {i}" for i in range(n)]
    print(f"corpus {n} x {dim} float32 ({args.topics} topics), {args.queries} queries, k={k}, "
          f"torch threads {torch.get_num_threads()}", flush=True)

    t0 = time.perf_counter()
    lc = FAISS(NoEmbeddings(), faiss.IndexFlatL2(dim), InMemoryDocstore(), {})
    lc.add_embeddings(zip(texts, corpus, strict=True))
    lc_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    flat = AscendFAISS.from_embeddings(zip(texts, corpus, strict=True), NoEmbeddings(),
                                       device=args.device)
    flat_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    ivf = AscendFAISS.from_embeddings(zip(texts, corpus, strict=True), NoEmbeddings(),
                                      device=args.device, index_type="ivf", nlist=args.nlist,
                                      nprobe=args.nprobe)
    ivf.index.train()
    ivf_build = time.perf_counter() - t0
    print(f"build s: lc {lc_build:.1f}  flat {flat_build:.1f}  ivf (incl. k-means) "
          f"{ivf_build:.1f}  device {flat.device}", flush=True)

    truth = brute_force_topk(corpus, queries, k)
    raw = faiss.IndexFlatL2(dim)
    raw.add(corpus)
    data_t = torch.from_numpy(corpus).to(flat.device)
    queries_t = torch.from_numpy(queries).to(flat.device)
    sq = (data_t * data_t).sum(1)

    def torch_single() -> None:
        for q in queries_t[: args.single_queries]:
            (torch.mv(data_t, q) * 2 - sq).topk(k)

    def torch_batched() -> None:
        (queries_t @ data_t.T * 2 - sq).topk(k, dim=1)

    def batched_ours() -> list:
        return flat.similarity_search_with_score_by_vectors(queries, k=k)

    warm = single[:4]
    for search in (lc.similarity_search_with_score_by_vector,
                   flat.similarity_search_with_score_by_vector,
                   ivf.similarity_search_with_score_by_vector):
        single_loop(search, warm, k)()
    batched_ours()
    raw.search(queries[:8], k)

    best: dict[str, float] = {}

    def keep(name: str, value: float) -> None:
        best[name] = max(best.get(name, 0.0), value)

    for _ in range(args.rounds):
        keep("lc_single", qps(single_loop(lc.similarity_search_with_score_by_vector, single, k),
                              len(single)))
        keep("flat_single", qps(single_loop(flat.similarity_search_with_score_by_vector, single,
                                            k), len(single)))
        keep("ivf_single", qps(single_loop(ivf.similarity_search_with_score_by_vector, single,
                                           k), len(single)))
        keep("flat_batched", qps(batched_ours, len(queries)))
        keep("ivf_batched", qps(lambda: ivf.similarity_search_with_score_by_vectors(queries, k=k),
                                len(queries)))
        keep("faiss_raw_batched", qps(lambda: raw.search(queries, k), len(queries)))
        keep("torch_single", qps(torch_single, len(single)))
        keep("torch_batched", qps(torch_batched, len(queries)))

    flat_rows = [[int(d.page_content.split()[1]) for d, _ in hits] for hits in batched_ours()]
    flat_single_rows = [[int(d.page_content.split()[1]) for d, _ in
                         flat.similarity_search_with_score_by_vector(q, k=k)] for q in single]
    ivf_rows = [[int(d.page_content.split()[1]) for d, _ in
                 ivf.similarity_search_with_score_by_vector(q, k=k)] for q in query_lists]
    lc_rows = [[int(d.page_content.split()[1]) for d, _ in
                lc.similarity_search_with_score_by_vector(q, k=k)] for q in single[:16]]
    result = {
        "bench": "vectorstore",
        "num_vectors": n, "dim": dim, "queries": len(queries), "k": k,
        "device": str(flat.device),
        **{f"{name}_qps": round(value, 1) for name, value in best.items()},
        "recall_flat": recall(flat_rows, truth),
        "recall_flat_single": recall(flat_single_rows, truth[: len(single)]),
        "recall_lc": recall(lc_rows, truth[:16]),
        "recall_ivf": recall(ivf_rows, truth),
        "ivf_nlist": ivf.index.nlist, "ivf_nprobe": ivf.index.nprobe,
        "ivf_build_s": round(ivf_build, 1),
    }
    lc_qps = best["lc_single"]
    result["ratio_flat_single_vs_lc"] = round(best["flat_single"] / lc_qps, 2)
    result["ratio_flat_batched_vs_lc_single"] = round(best["flat_batched"] / lc_qps, 2)
    result["ratio_ivf_single_vs_lc"] = round(best["ivf_single"] / lc_qps, 2)

    print(f"{'':28}{'q/s':>10}")
    for name, value in best.items():
        print(f"{name:28}{value:10.1f}")
    print(f"recall@{k}: flat {result['recall_flat']:.4f} (single {result['recall_flat_single']:.4f})"
          f"  lc {result['recall_lc']:.4f}  ivf {result['recall_ivf']:.4f} "
          f"(nlist {result['ivf_nlist']}, nprobe {result['ivf_nprobe']})")
    print(f"flat single   {result['ratio_flat_single_vs_lc']:6.2f}x lc single   (bar >= 1.3)")
    print(f"flat batched  {result['ratio_flat_batched_vs_lc_single']:6.2f}x lc single   (bar >= 20)")
    print(f"ivf single    {result['ratio_ivf_single_vs_lc']:6.2f}x lc single   (bar >= 10, "
          "recall >= 0.95)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
