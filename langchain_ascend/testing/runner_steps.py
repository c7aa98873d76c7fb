"""Drive a model runner directly (no scheduler): one prefill step, then greedy decode steps."""

from __future__ import annotations

from typing import Any

from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams


def greedy_decode(runner: Any, prompts: list[list[int]], num_new: int, *,
                  blocks_per_request: int) -> list[list[int]]:
    """Greedy tokens of ``prompts`` decoded together on ``runner`` (a ``ModelRunner``).

    Request ``i`` gets blocks ``[i * blocks_per_request, (i + 1) * blocks_per_request)``; the
    first step prefills every prompt, then ``num_new`` pure-decode steps follow. The requests
    are released at the end. Returns ``num_new + 1`` tokens per prompt.
    """
    greedy = SamplingParams(max_tokens=num_new + 1)
    width = blocks_per_request
    tables = [list(range(i * width, (i + 1) * width)) for i in range(len(prompts))]
    first = runner.execute(ScheduledBatch(segments=[
        ScheduledSegment(f"r{i}", p, 0, tables[i], True, greedy) for i, p in enumerate(prompts)]))
    out = [[token] for token in first]
    for _ in range(num_new):
        segments = [ScheduledSegment(f"r{i}", [out[i][-1]], len(p) + len(out[i]) - 1, tables[i],
                                     True, greedy) for i, p in enumerate(prompts)]
        for i, token in enumerate(runner.execute(ScheduledBatch(segments=segments))):
            out[i].append(token)
    runner.release([f"r{i}" for i in range(len(prompts))])
    return out
