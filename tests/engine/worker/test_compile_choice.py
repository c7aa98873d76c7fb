"""``compile="auto"`` on the CPU: the compiled static step only where warm-up measured it
faster and greedy-identical, no compile where the eager step already beats torch's products
alone, the decision cache, and ``compile=True``'s greedy-parity guard.

Compiles are faked (``compile_fn=``): :class:`FakeCompile` returns the static step itself,
optionally slowed or with its greedy token shifted, and :class:`SlowEager` slows the eager
step, so each rule of the choice is tested without waiting for inductor. Torch's products
timing is monkeypatched where a test needs the pre-compile rule to skip or not.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch
from transformers import AutoTokenizer

from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.llm_engine import LLMEngine
from langchain_ascend.engine.worker import compile as step_compile
from langchain_ascend.engine.worker import compile_choice, draft_cost
from langchain_ascend.engine.worker.compile import StepCompiler, resolve_compile, resolve_plan
from langchain_ascend.engine.worker.compile_choice import (
    BUDGET_ENV_VAR,
    CACHE_ENV_VAR,
    CompileChoice,
    decide,
    skip_reason,
)
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.testing.runner_steps import greedy_decode

BLOCK = 4
CPU = torch.device("cpu")
DELAY_S = 0.1
"""Far above the tiny model's step, so the medians cannot be swapped by noise."""
PROMPT = [11, 512, 7, 3001, 42]
NUM_NEW = 8  # 5 + 8 + 1 tokens fit 4 blocks: every decode runs at bucket (1, 4)


TORCH_PRODUCTS_MS = step_compile.torch_products_ms
"""The real measurement; the autouse fixture stands it in with 0 ms."""


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A fresh decision cache per test, the default budget, one thread (steady timings), and
    torch's products timed at 0 ms: on the tiny model the eager step and the products alone
    take about as long, so the pre-compile rule would skip the compile by noise (a loaded CI
    machine did). Tests of that rule stand in their own value."""
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "choices"))
    monkeypatch.delenv(BUDGET_ENV_VAR, raising=False)
    monkeypatch.setattr(step_compile, "torch_products_ms", lambda *args, **kwargs: 0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def path(tiny_model_paths):
    return str(tiny_model_paths["qwen2"])


def load(path: str, compile: bool | str = "auto", dtype: str = "float32") -> ModelRunner:
    return ModelRunner.load(path, device="cpu", dtype=dtype, block_size=BLOCK, num_blocks=40,
                            compile=compile, max_batch_size=4)


class FakeCompile:
    """A ``compile_fn`` whose callables run the static step eagerly, ``delay_s`` slower, and
    from call ``wrong_from`` on with every row's greedy token shifted by one."""

    def __init__(self, delay_s: float = 0.0, wrong_from: int | None = None, inner=None) -> None:
        self.delay_s = delay_s
        self.wrong_from = wrong_from
        self.inner = inner or (lambda fn: fn)
        self.compiles = 0
        self.calls = 0

    def __call__(self, fn):
        self.compiles += 1
        compiled_fn = self.inner(fn)

        def compiled(*views):
            self.calls += 1
            time.sleep(self.delay_s)
            logits = compiled_fn(*views)  # (B, V)
            if self.wrong_from is not None and self.calls >= self.wrong_from:
                return logits.roll(1, dims=-1)  # (B, V): every argmax moves one token up
            return logits

        return compiled


class SlowEager:
    """The runner's logits head, ``delay_s`` slower whenever the step runs eagerly."""

    def __init__(self, runner: ModelRunner, delay_s: float = DELAY_S) -> None:
        self.inner = runner.logits_head
        self.delay_s = delay_s

    def run(self, runner, packed, params):
        if not runner.compiler.enabled:
            time.sleep(self.delay_s)
        return self.inner.run(runner, packed, params)


def auto(runner: ModelRunner, fake: FakeCompile) -> StepCompiler:
    runner.compiler = StepCompiler(runner.static, device=CPU, mode="auto", compile_fn=fake)
    return runner.compiler


def decode(runner: ModelRunner) -> list[int]:
    return greedy_decode(runner, [PROMPT], NUM_NEW, blocks_per_request=4)[0]


def test_auto_on_cpu_stays_eager_without_warmup(path):
    assert resolve_plan("auto", CPU) == "measure" and resolve_compile("auto", CPU) is False
    runner = load(path)
    assert runner.static is not None and runner.compiler.plan == "measure"
    fake = FakeCompile()
    compiler = auto(runner, fake)
    assert decode(runner) == decode(load(path, compile=False))
    assert fake.compiles == 0 and compiler.choice is None
    assert not compiler.enabled and compiler.plan == "measure"


def test_auto_keeps_a_faster_greedy_identical_compiled_step(path, caplog):
    runner = load(path)
    fake = FakeCompile(inner=lambda fn: torch.compile(fn, backend="eager", fullgraph=True,
                                                      dynamic=False))
    compiler = auto(runner, fake)
    runner.logits_head = SlowEager(runner)
    with caplog.at_level(logging.INFO, logger="langchain_ascend.engine.worker.compile"):
        runner.warmup()
    choice = compiler.choice
    assert choice is not None and choice.chosen == "compiled", choice
    assert choice.bucket == (1, 4) and choice.compiled_ms < choice.eager_ms
    assert choice.compile_s is not None and not choice.cached
    assert compiler.plan == "compile" and list(compiler.bucket_to_fn) == [(1, 4)]
    lines = [r.getMessage() for r in caplog.records if "compile='auto'" in r.getMessage()]
    assert len(lines) == 1 and "runs compiled" in lines[0] and "ms" in lines[0]

    runner.logits_head = runner.logits_head.inner
    calls = fake.calls
    assert decode(runner) == decode(load(path, compile=False))
    assert fake.calls - calls == NUM_NEW  # every decode step took the compiled bucket
    assert fake.compiles == 1  # no other bucket is compiled on a request path
    assert decode_wider(runner) and fake.compiles == 1


def decode_wider(runner: ModelRunner) -> list[int]:
    """Two rows: bucket (2, 4), which ``"auto"`` did not compile, so the step runs eagerly."""
    return greedy_decode(runner, [PROMPT, PROMPT[::-1]], 2, blocks_per_request=4)[0]


def test_auto_chooses_eager_when_compiled_is_slower(path):
    runner = load(path)
    fake = FakeCompile(delay_s=DELAY_S)
    compiler = auto(runner, fake)
    runner.warmup()
    assert compiler.choice.chosen == "eager" and "not 5% faster" in compiler.choice.reason
    assert compiler.choice.compiled_ms > compiler.choice.eager_ms
    assert compiler.plan == "eager" and not compiler.enabled and not compiler.bucket_to_fn
    calls = fake.calls
    decode(runner)
    assert fake.calls == calls and compiler.failure is None


@pytest.mark.parametrize("wrong_from", [1, 2], ids=["first-run-guard", "timed-steps"])
def test_auto_chooses_eager_when_greedy_tokens_differ(path, wrong_from):
    runner = load(path)
    compiler = auto(runner, FakeCompile(wrong_from=wrong_from))
    runner.logits_head = SlowEager(runner)  # faster, but wrong
    runner.warmup()
    choice = compiler.choice
    assert choice.chosen == "eager" and "greedy parity" in choice.reason, choice
    assert ("ParityError" in choice.reason) == (wrong_from == 1)
    assert compiler.plan == "eager" and not compiler.enabled


def test_warmup_measurement_writes_no_real_block(path):
    runner = load(path)
    compiler = auto(runner, FakeCompile())
    runner.logits_head = SlowEager(runner)
    greedy = SamplingParams(max_tokens=4)
    runner.execute(ScheduledBatch(segments=[
        ScheduledSegment("real", list(range(1, 11)), 0, [0, 1, 2], True, greedy)]))
    cache = runner.kv_cache
    real = [cache.block(layer, b).clone() for layer in range(cache.num_layers)
            for b in range(runner.num_blocks)]
    runner.warmup()
    assert compiler.choice.chosen == "compiled"
    after = [cache.block(layer, b) for layer in range(cache.num_layers)
             for b in range(runner.num_blocks)]
    assert all(torch.equal(a, b) for a, b in zip(real, after, strict=True))
    runner.release(["real"])


def cache_files(tmp_path) -> list:
    return sorted((tmp_path / "choices").glob("*.json"))


def test_a_cached_eager_decision_skips_the_compile(path, tmp_path):
    first_runner = load(path)
    first = auto(first_runner, FakeCompile(delay_s=DELAY_S))
    first_runner.warmup()
    assert first.choice.chosen == "eager" and len(cache_files(tmp_path)) == 1

    again = load(path)
    fake = FakeCompile()
    compiler = auto(again, fake)
    again.logits_head = SlowEager(again)  # would now measure compiled faster
    again.warmup()
    assert fake.compiles == 0 and compiler.choice.cached
    assert compiler.choice.chosen == "eager" and compiler.choice.reason == first.choice.reason


def test_a_cached_compiled_decision_compiles_and_rechecks_parity(path, tmp_path):
    runner = load(path)
    auto(runner, FakeCompile())
    runner.logits_head = SlowEager(runner)
    runner.warmup()
    assert runner.compiler.choice.chosen == "compiled"

    again = load(path)
    fake = FakeCompile(delay_s=DELAY_S / 10)  # no longer faster: the cached decision holds
    compiler = auto(again, fake)
    again.warmup()
    assert fake.compiles == 1 and compiler.choice.cached and compiler.choice.chosen == "compiled"
    assert compiler.plan == "compile"

    wrong = load(path)
    compiler = auto(wrong, FakeCompile(wrong_from=2))  # parity now fails: eager, re-cached
    wrong.warmup()
    assert compiler.choice.chosen == "eager" and not compiler.choice.cached
    stored = json.loads(cache_files(tmp_path)[0].read_text())
    assert stored["choice"]["chosen"] == "eager"


def test_a_corrupt_cache_file_is_ignored(path, tmp_path, caplog):
    runner = load(path)
    auto(runner, FakeCompile(delay_s=DELAY_S))
    runner.warmup()
    (file,) = cache_files(tmp_path)
    file.write_text("{not json")
    again = load(path)
    fake = FakeCompile(delay_s=DELAY_S)
    compiler = auto(again, fake)
    with caplog.at_level(logging.DEBUG, logger="langchain_ascend.engine.worker.compile_choice"):
        again.warmup()
    assert fake.compiles == 1 and not compiler.choice.cached
    assert "ignoring the compile decision cache file" in caplog.text
    assert json.loads(file.read_text())["choice"]["chosen"] == "eager"  # rewritten whole
    assert not list((tmp_path / "choices").glob("*.tmp"))


def test_the_cache_key_follows_the_model_dtype_and_bucket(path):
    fp32, bf16 = load(path), load(path, dtype="bfloat16")
    keys = [compile_choice.model_fingerprint(r.model, r.dtype,
                                             r.hooks.changes.get("weight_layout"))
            for r in (fp32, load(path), bf16)]
    assert keys[0] == keys[1] != keys[2]
    one, two = (compile_choice.choice_key(keys[0], bucket, "inductor")
                for bucket in ((1, 4), (2, 4)))
    assert compile_choice.cache_path(one) != compile_choice.cache_path(two)
    assert one["torch"] == torch.__version__ and one["threads"] == 1 and one["cpu"]


def test_a_zero_budget_skips_the_measurement(path, monkeypatch):
    monkeypatch.setenv(BUDGET_ENV_VAR, "0")
    runner = load(path)
    fake = FakeCompile()
    compiler = auto(runner, fake)
    runner.warmup()
    assert fake.compiles == 0 and compiler.choice.chosen == "eager"
    assert BUDGET_ENV_VAR in compiler.choice.reason
    monkeypatch.setenv(BUDGET_ENV_VAR, "soon")
    with pytest.raises(ValueError, match=BUDGET_ENV_VAR):
        compile_choice.compile_budget_s()


def test_the_rule():
    fast = dict(eager_ms=10.0, compiled_ms=9.0, compile_s=20.0, problem=None, budget_s=300.0)
    assert decide((1, 4), **fast).chosen == "compiled"
    assert decide((1, 4), **{**fast, "compiled_ms": 9.6}).chosen == "eager"  # 4% is not enough
    over = decide((1, 4), **{**fast, "compile_s": 301.0})
    assert over.chosen == "eager" and "budget" in over.reason and over.compile_s == 301.0
    broken = decide((1, 4), **{**fast, "problem": "greedy parity: x"})
    assert broken.chosen == "eager" and "greedy parity" in broken.reason
    assert CompileChoice.from_dict(over.as_dict()) == over
    with pytest.raises(ValueError):
        CompileChoice("maybe", "", (1, 4))


def test_engine_stats_say_what_auto_chose(path):
    runner = load(path)
    auto(runner, FakeCompile(delay_s=DELAY_S))
    engine = LLMEngine.from_runner(runner, AutoTokenizer.from_pretrained(path))
    try:
        assert engine.stats().decode_step["plan"] == "measure"
        engine.warmup()
        step = engine.stats().decode_step
        assert step["plan"] == "eager" and step["choice"]["chosen"] == "eager"
        assert step["choice"]["eager_ms"] > 0 and step["choice"]["bucket"] == [1, 4]
    finally:
        engine.shutdown()


def test_compile_true_turns_off_a_compiled_step_with_other_greedy_tokens(path, caplog):
    runner = load(path, compile="static")
    fake = FakeCompile(wrong_from=1)
    runner.compiler = StepCompiler(runner.static, device=CPU, mode=True, compile_fn=fake)
    assert runner.compiler.plan == "compile" and runner.compiler.compiles_on_demand
    with caplog.at_level(logging.WARNING, logger="langchain_ascend.engine.worker.compile"):
        tokens = decode(runner)
    assert fake.compiles == 1 and fake.calls == 1  # tried once, then eager for good
    assert not runner.compiler.enabled and "greedy parity" in runner.compiler.failure
    assert "running eagerly" in caplog.text
    assert tokens == decode(load(path, compile=False))


def test_the_rule_before_compiling():
    reason = skip_reason(25.1, 58.0)
    assert reason is not None and "25.1 ms" in reason and "58.0 ms" in reason
    assert "not compiled" in reason
    assert skip_reason(9.5, 10.0) is not None  # exactly 5% under the products: skip
    assert skip_reason(9.6, 10.0) is None  # a compiled step of 9.0 ms could still win
    assert skip_reason(58.0, 25.1) is None


def products_ms(value: float):
    """A stand-in for ``compile.torch_products_ms`` that returns ``value`` and counts calls."""
    calls = []

    def fake(model, rows, passes=step_compile.PRODUCTS_PASSES):
        calls.append(rows)
        return value

    return fake, calls


def test_auto_compiles_nothing_where_the_eager_step_beats_torch_products(
        path, tmp_path, monkeypatch, caplog):
    fake_products, calls = products_ms(1e6)
    monkeypatch.setattr(step_compile, "torch_products_ms", fake_products)
    runner = load(path)
    fake = FakeCompile()
    compiler = auto(runner, fake)
    runner.logits_head = SlowEager(runner)  # the compiled step would even be faster
    with caplog.at_level(logging.INFO, logger="langchain_ascend.engine.worker.compile"):
        runner.warmup()
    choice = compiler.choice
    assert fake.compiles == 0 and fake.calls == 0 and calls == [1], choice
    assert choice.chosen == "eager" and "not compiled" in choice.reason
    assert choice.eager_ms >= DELAY_S * 1e3 and choice.products_ms == 1e6
    assert choice.compiled_ms is None and choice.compile_s is None and not choice.cached
    assert compiler.plan == "eager" and not compiler.enabled
    assert "torch's products" in caplog.text
    (file,) = cache_files(tmp_path)
    assert json.loads(file.read_text())["choice"]["reason"] == choice.reason

    again = load(path)  # the cached decision: no products measured, nothing compiled
    fake = FakeCompile()
    compiler = auto(again, fake)
    again.warmup()
    assert fake.compiles == 0 and calls == [1]
    assert compiler.choice.cached and compiler.choice.reason == choice.reason


def test_auto_compiles_where_torch_products_leave_room(path, monkeypatch):
    fake_products, calls = products_ms(0.0)
    monkeypatch.setattr(step_compile, "torch_products_ms", fake_products)
    runner = load(path)
    fake = FakeCompile()
    compiler = auto(runner, fake)
    runner.logits_head = SlowEager(runner)
    runner.warmup()
    assert calls == [1] and fake.compiles == 1
    assert compiler.choice.chosen == "compiled" and compiler.choice.products_ms == 0.0
    assert compiler.choice.compile_s is not None and compiler.choice.compiled_ms is not None


def test_torch_products_run_every_linear_weight_once_per_pass(path, monkeypatch):
    runner = load(path)
    linears = [m for m in runner.model.modules() if isinstance(m, torch.nn.Linear)]
    assert runner.model.lm_head in linears
    seen = []
    linear = torch.nn.functional.linear

    def counting(x, weight, bias=None):
        seen.append((tuple(x.shape), weight))
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", counting)
    ms = TORCH_PRODUCTS_MS(runner.model, 2, passes=3)
    assert ms > 0 and len(seen) == 3 * len(linears)
    assert {id(w) for _, w in seen} == {id(m.weight) for m in linears}
    assert all(shape == (2, w.shape[1]) for shape, w in seen)


def test_a_drafted_rows_cost_is_measured_once_then_read_from_the_cache(path, tmp_path,
                                                                       monkeypatch):
    measured: list[float] = []
    real = draft_cost.measure

    def counted(runner, *args, **kwargs):
        measured.append(real(runner, *args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(draft_cost, "measure", counted)
    first = load(path, compile=False).draft_row_cost()
    assert len(measured) == 1 and first == measured[0] >= 0.0
    assert load(path, compile=False).draft_row_cost() == first  # another load: the cache
    assert len(measured) == 1
    assert load(path, compile=False, dtype="bfloat16").draft_row_cost() >= 0.0  # another key
    assert len(measured) == 2
    assert len(list((tmp_path / "choices").glob("*.json"))) == 2
