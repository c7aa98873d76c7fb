"""What a drafted token's row costs in a decode pass, measured on the runner and cached.

Speculation's ``"auto"`` drafts only while the acceptance rate beats what a drafted row costs
in the step it joins (``Scheduler.step_row_cost``). The cost is a property of the model, the
CPU and the thread count, so it is measured once (17 model steps: seconds of a load at 8B) and
kept with warm-up's measurements (``engine.worker.measured``); a later load of the same model
on the same machine reads it.
"""

from __future__ import annotations

import time
from typing import Any

from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.worker.measured import (
    load_measured,
    measure_key,
    model_fingerprint,
    store_measured,
)

MEASURE_REQUEST_ID = "__measure__"
"""The request id of the measuring steps (on the scratch block; released after)."""


def cached(runner: Any) -> float:
    """:func:`measure` of ``runner`` (a ``ModelRunner``), read from the cache of warm-up's
    measurements where this model, dtype, layout, format and device were measured before on
    this machine, else measured and stored."""
    key = measure_key(model_fingerprint(runner.model, runner.dtype, "|".join(
        [str(runner.hooks.changes.get("weight_layout")), runner.weights.get("format", ""),
         str(runner.device)])), (runner.block_size, 0), "draft_row_cost")
    value = load_measured(key)
    if value is None:
        value = measure(runner)
        store_measured(key, value)
    return value


def measure(runner: Any, rows: int = 5, repeats: int = 7) -> float:
    """What one more query row costs in a decode pass, in units of a one-row pass.

    Times a one-token step and a verify pass of ``rows`` tokens (one known, ``rows - 1``
    drafted: packed as that many decode rows, ``packing``) after an 8-token context on the
    scratch block, greedy, ``repeats`` times each in turn, keeps the fastest of each (other
    processes' load only ever adds time: on a loaded 2-core host the median of 3 came out near
    0, "drafting is free", in 11 of 29 measurements, the fastest of 5-7 in 2 of 38; the spread
    stays wide under such load), and returns ``(t_rows / t_1 - 1) / (rows - 1)``: near 0 where
    a pass is bound by reading the weights (drafting nearly free), near 1 where each row costs
    a full pass (a CPU without fast bfloat16 products: drafting cannot pay). 0.0 where the
    scratch block is too small to measure.
    """
    context = 8
    if runner.block_size < context + rows or rows < 2:
        return 0.0
    block = [runner.scratch_block_id]
    greedy = SamplingParams(max_tokens=1)

    def step(num_tokens: int) -> float:
        segment = ScheduledSegment(MEASURE_REQUEST_ID, [0] * num_tokens, context, block, True,
                                   greedy, draft_token_ids=[0] * (num_tokens - 1))
        start = time.perf_counter()
        runner.execute(ScheduledBatch(segments=[segment]))
        return time.perf_counter() - start

    runner.execute(ScheduledBatch(segments=[
        ScheduledSegment(MEASURE_REQUEST_ID, [0] * context, 0, block, True, greedy)]))
    step(1), step(rows)  # first calls of each shape allocate
    one = many = float("inf")
    for _ in range(repeats):
        one, many = min(one, step(1)), min(many, step(rows))
    runner.release([MEASURE_REQUEST_ID])
    return max(0.0, (many / one - 1.0) / (rows - 1)) if one > 0 else 0.0
