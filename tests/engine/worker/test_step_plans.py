"""How pure-decode steps run (``engine.worker.compile``): ``compile="auto"`` is eager on the CPU
(the owned model's native stack decodes), ``compile=True``'s greedy-parity guard turns a
miscompiled step off; and warm-up's measurement cache (``engine.worker.measured``).

Compiles are faked (``compile_fn=``): :class:`FakeCompile` returns the static step itself,
optionally with its greedy token shifted, so the guard is tested without waiting for inductor.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from langchain_ascend.engine.worker import draft_cost, measured
from langchain_ascend.engine.worker.compile import StepCompiler, resolve_compile, resolve_plan
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.testing.runner_steps import greedy_decode

BLOCK = 4
CPU = torch.device("cpu")
PROMPT = [11, 512, 7, 3001, 42]
NUM_NEW = 8  # 5 + 8 + 1 tokens fit 4 blocks: every decode runs at bucket (1, 4)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A fresh measurement cache per test."""
    monkeypatch.setenv(measured.CACHE_ENV_VAR, str(tmp_path / "measured"))


@pytest.fixture
def path(tiny_model_paths):
    return str(tiny_model_paths["qwen2"])


def load(path: str, compile: bool | str = "auto", dtype: str = "float32") -> ModelRunner:
    return ModelRunner.load(path, device="cpu", dtype=dtype, block_size=BLOCK, num_blocks=40,
                            compile=compile, max_batch_size=4)


class FakeCompile:
    """A ``compile_fn`` whose callables run the static step eagerly, from call ``wrong_from``
    on with every row's greedy token shifted by one."""

    def __init__(self, wrong_from: int | None = None) -> None:
        self.wrong_from = wrong_from
        self.compiles = 0
        self.calls = 0

    def __call__(self, fn):
        self.compiles += 1

        def compiled(*views):
            self.calls += 1
            logits = fn(*views)  # (B, V)
            if self.wrong_from is not None and self.calls >= self.wrong_from:
                return logits.roll(1, dims=-1)  # (B, V): every argmax moves one token up
            return logits

        return compiled


def decode(runner: ModelRunner) -> list[int]:
    return greedy_decode(runner, [PROMPT], NUM_NEW, blocks_per_request=4)[0]


def test_auto_runs_eager_on_the_cpu(path):
    assert resolve_plan("auto", CPU) == "eager" and resolve_compile("auto", CPU) is False
    assert resolve_plan(False, CPU) == "eager" and resolve_plan("static", CPU) == "static"
    with pytest.raises(ValueError, match="compile"):
        resolve_plan("sometimes", CPU)
    runner = load(path)
    assert runner.static is None and runner.compiler.plan == "eager"
    runner.warmup()
    assert runner.compiler.describe() == {"plan": "eager", "compiled_buckets": [],
                                          "failure": None}
    assert decode(runner) == decode(load(path, compile=False))


def test_compile_true_keeps_a_greedy_identical_compiled_step(path):
    runner = load(path, compile="static")
    fake = FakeCompile()
    runner.compiler = StepCompiler(runner.static, device=CPU, mode=True, compile_fn=fake)
    assert runner.compiler.plan == "compile"
    tokens = decode(runner)
    assert fake.compiles >= 1 and runner.compiler.enabled and runner.compiler.failure is None
    assert runner.compiler.describe()["compiled_buckets"]
    assert tokens == decode(load(path, compile=False))


def test_compile_true_turns_off_a_compiled_step_with_other_greedy_tokens(path, caplog):
    runner = load(path, compile="static")
    fake = FakeCompile(wrong_from=1)
    runner.compiler = StepCompiler(runner.static, device=CPU, mode=True, compile_fn=fake)
    with caplog.at_level(logging.WARNING, logger="langchain_ascend.engine.worker.compile"):
        tokens = decode(runner)
    assert fake.compiles == 1 and fake.calls == 1  # tried once, then eager for good
    assert not runner.compiler.enabled and "greedy parity" in runner.compiler.failure
    assert "running eagerly" in caplog.text
    assert tokens == decode(load(path, compile=False))


def test_the_measurement_key_follows_the_model_dtype_and_shape(path):
    fp32, bf16 = load(path), load(path, dtype="bfloat16")
    keys = [measured.model_fingerprint(r.model, r.dtype, r.hooks.changes.get("weight_layout"))
            for r in (fp32, load(path), bf16)]
    assert keys[0] == keys[1] != keys[2]
    one, two = (measured.measure_key(keys[0], shape, "draft_row_cost")
                for shape in ((1, 4), (2, 4)))
    assert measured.cache_path(one) != measured.cache_path(two)
    assert one["torch"] == torch.__version__ and one["cpu"]


def test_a_measurement_is_stored_whole_and_a_corrupt_file_ignored(tmp_path, caplog):
    key = measured.measure_key("model", (1, 4), "draft_row_cost")
    assert measured.load_measured(key) is None
    measured.store_measured(key, 0.25)
    assert measured.load_measured(key) == 0.25
    path = measured.cache_path(key)
    assert json.loads(path.read_text())["key"] == key
    assert not list(path.parent.glob("*.tmp"))
    path.write_text("{not json")
    with caplog.at_level(logging.DEBUG, logger="langchain_ascend.engine.worker.measured"):
        assert measured.load_measured(key) is None
    assert "ignoring the measurement cache file" in caplog.text


def test_a_drafted_rows_cost_is_measured_once_then_read_from_the_cache(path, tmp_path,
                                                                       monkeypatch):
    counted: list[float] = []
    real = draft_cost.measure

    def counting(runner, *args, **kwargs):
        counted.append(real(runner, *args, **kwargs))
        return counted[-1]

    monkeypatch.setattr(draft_cost, "measure", counting)
    first = load(path, compile=False).draft_row_cost()
    assert len(counted) == 1 and first == counted[0] >= 0.0
    assert load(path, compile=False).draft_row_cost() == first  # another load: the cache
    assert len(counted) == 1
    assert load(path, compile=False, dtype="bfloat16").draft_row_cost() >= 0.0  # another key
    assert len(counted) == 2
    assert len(list((tmp_path / "measured").glob("*.json"))) == 2
