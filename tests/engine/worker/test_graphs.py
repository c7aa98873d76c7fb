"""Graph capture of the static decode step against a FAKE graph API (no GPU/NPU here).

The fake behaves like a CUDA graph: capturing records every aten op the step runs (through a
``TorchDispatchMode``) with the very tensors it touched, and ``replay()`` re-runs those ops on
the same memory. So a replay is only right if the step reads nothing but its static buffers,
and the fake also fails a capture that synchronises with the host (``.item()``, ``.tolist()``,
``.cpu()``) or that is not given the shared pool.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from langchain_ascend.attention import registry
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
from langchain_ascend.engine import hf_config
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.worker.compile import StepCompiler
from langchain_ascend.engine.worker.hooks import ModelHooks
from langchain_ascend.engine.worker.kv_cache import KVCache
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.platform import GraphAPI
from langchain_ascend.testing.runner_steps import greedy_decode

BLOCK = 4
GREEDY = SamplingParams(max_tokens=64)
_SYNCS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


class HostSyncInCapture(RuntimeError):
    pass


def _copy_into(recorded, fresh):
    if isinstance(recorded, torch.Tensor) and isinstance(fresh, torch.Tensor):
        if recorded is not fresh:
            recorded.copy_(fresh)
    elif isinstance(recorded, (tuple, list)):
        for r, f in zip(recorded, fresh, strict=True):
            _copy_into(r, f)


class _Recorder(TorchDispatchMode):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNCS:
            raise HostSyncInCapture(f"{func} inside a graph capture")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class FakeGraph:
    def __init__(self):
        self.ops = []
        self.pool = None
        self.replays = 0

    def replay(self):
        self.replays += 1
        for func, args, kwargs, out in self.ops:
            _copy_into(out, func(*args, **kwargs))


class FakeGraphAPI:
    """``GraphAPI`` pieces plus what the test inspects."""

    def __init__(self, fail_bucket_rows=None):
        self.handle = object()
        self.graphs = []
        self.captures = 0
        self.fail_bucket_rows = fail_bucket_rows
        self.input_ptrs = []

    def new_graph(self):
        graph = FakeGraph()
        self.graphs.append(graph)
        return graph

    def pool_handle(self):
        return self.handle

    def graph(self, graph, pool=None):
        api = self

        class Capture:
            def __enter__(self):
                assert pool is api.handle, "every capture must share the one pool"
                graph.pool = pool
                self.patches = {name: getattr(torch.Tensor, name) for name in
                                ("item", "tolist", "cpu")}

                def refuse(*args, **kwargs):
                    raise HostSyncInCapture("host sync inside a graph capture")

                for name in self.patches:
                    setattr(torch.Tensor, name, refuse)
                self.mode = _Recorder(graph.ops)
                self.mode.__enter__()
                api.captures += 1

            def __exit__(self, *exc):
                self.mode.__exit__(*exc)
                for name, original in self.patches.items():
                    setattr(torch.Tensor, name, original)
                return False

        return Capture()

    def as_api(self):
        return GraphAPI(new_graph=self.new_graph, graph=self.graph,
                        pool_handle=self.pool_handle, synchronize=lambda: None)


@pytest.fixture(scope="module")
def plain_model(tiny_model_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["llama"],
                                                 attn_implementation=registry.register())
    model.config.max_position_embeddings = 64  # table widths 4, 8, 16 blocks
    return model.eval()


def make_runner(model, compile="static"):
    """A runner over ``model`` without the CPU seam (its native kernels are not torch ops)."""
    layers, heads, kv_heads, head_dim = hf_config.attention_geometry(model.config)
    backend = TorchRefBackend(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                              dtype=torch.float32, device=torch.device("cpu"))
    cache = KVCache(backend, num_layers=layers, num_blocks=49, block_size=BLOCK)
    return ModelRunner(model, backend=backend, kv_cache=cache, max_batch_size=4,
                       compile=compile, hooks=ModelHooks())


def with_graphs(runner, api):
    runner.compiler = StepCompiler(runner.static, device=torch.device("cpu"), mode=True,
                                   graph_api=api.as_api())
    return runner


def decode_run(runner, prompts, num_new=6):
    return greedy_decode(runner, prompts, num_new, blocks_per_request=12)


PROMPTS = [[5, 6, 7], list(range(40, 60)), [9] * 11]


def test_capture_largest_first_into_one_pool_and_replay_matches_eager(plain_model):
    api = FakeGraphAPI()
    runner = with_graphs(make_runner(plain_model), api)
    runner.warmup()
    graphs = runner.compiler.graphs
    order = graphs.capture_order
    assert len(order) == 3 * 3 and not graphs.failures  # batch buckets 1, 2, 4 x widths 4, 8, 16
    assert order[0] == (4, 16) and order[-1] == (1, 4)
    sizes = [rows * width for rows, width in order]
    assert sizes == sorted(sizes, reverse=True)
    assert api.captures == 9 and all(g.pool is api.handle for g in api.graphs)
    ptrs = {key: [v.data_ptr() for v in runner.static.views(key)] for key in order}
    before = sum(g.replays for g in api.graphs)  # warmup's own decode step replayed one
    expected = decode_run(make_runner(plain_model, compile=False), PROMPTS)
    assert decode_run(runner, PROMPTS) == expected
    replays = sum(g.replays for g in api.graphs) - before
    assert before == 1 and replays == 6  # every pure decode replayed; the prefill ran eagerly
    assert ptrs == {key: [v.data_ptr() for v in runner.static.views(key)] for key in order}


def test_without_warmup_the_first_decode_captures(plain_model):
    api = FakeGraphAPI()
    runner = with_graphs(make_runner(plain_model), api)
    assert decode_run(runner, PROMPTS[:1], num_new=3) == decode_run(
        make_runner(plain_model, compile=False), PROMPTS[:1], num_new=3)
    assert api.captures == 9 and sum(g.replays for g in api.graphs) == 3


def test_a_host_sync_inside_the_step_fails_that_capture_with_one_warning(plain_model, caplog):
    api = FakeGraphAPI()
    runner = with_graphs(make_runner(plain_model), api)
    static = runner.static
    original = static.step_fn

    def syncing(*views):
        if views[0].shape[0] == 2:
            views[4].max().item()  # a host read of the lengths: not capturable
        return original(*views)

    static.step_fn = syncing
    with caplog.at_level(logging.WARNING, logger="langchain_ascend.engine.worker.graphs"):
        runner.warmup()
    failures = runner.compiler.graphs.failures
    assert set(failures) == {(2, 4), (2, 8), (2, 16)}
    assert all("HostSyncInCapture" in why for why in failures.values())
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 3
    del static.step_fn
    eager = make_runner(plain_model, compile=False)
    assert decode_run(runner, PROMPTS[:2]) == decode_run(eager, PROMPTS[:2])  # bucket 2: eager
    assert decode_run(runner, PROMPTS[:1]) == decode_run(eager, PROMPTS[:1])  # bucket 1: replay
    assert runner.compiler.enabled


def test_graph_api_is_none_on_the_cpu():
    from langchain_ascend import platform

    assert platform.graph_api(torch.device("cpu")) is None
    assert platform.pins_memory(torch.device("cpu")) is False
