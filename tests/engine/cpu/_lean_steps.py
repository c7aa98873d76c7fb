"""Shared pieces of the owned-model tests (its per-op path, the native stack): a runner with
one product choice, the decode prompts and a mixed step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu import weight_layout
from langchain_ascend.engine.worker.model_runner import ModelRunner

PROMPTS = [[5, 17, 300, 41, 9, 2, 77], [8, 8, 100], [3] * 13]
"""Three unrelated prompts decoded together."""


def prepared_runner(path: Any, dtype: Any, *, without: Sequence[tuple[Any, str, Any]] = (),
                    weight_layout_name: str = "auto", stack: bool = True) -> ModelRunner:
    """A CPU runner of the model at ``path`` whose native row limit is 64 for every product
    (the measured one may differ between two runners and change their rounding), with each
    ``(owner, function, nothing)`` of ``without`` made to prepare nothing (return
    ``nothing``); ``stack=False``: its owned model runs every step per op (no native stack)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weight_layout, "measure_native_max_rows", lambda linear: 64)
        for owner, name, nothing in without:
            patch.setattr(owner, name, lambda *args, nothing=nothing: nothing)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        runner = ModelRunner.from_model(model, num_blocks=64, block_size=4, compile=False,
                                        weight_layout=weight_layout_name)
    return runner if stack else without_stack(runner)


def without_stack(runner: ModelRunner) -> ModelRunner:
    """``runner`` with its owned model's native stack taking no step (every step per op)."""
    assert runner.hooks.owned_model is not None
    runner.hooks.owned_model.stack.max_rows = 0
    return runner


def mixed_step_logits(runner: ModelRunner) -> Any:
    """``(4, V)`` logits of a mixed step after a prefill: two decodes, a chunk after a cached
    prefix, a fresh prompt."""
    greedy = SamplingParams(max_tokens=4)
    runner.forward_batch([ScheduledSegment("a", list(range(1, 10)), 0, [0, 1, 2], True, greedy),
                          ScheduledSegment("b", list(range(20, 26)), 0, [3, 4], True, greedy)])
    return runner.forward_batch([
        ScheduledSegment("a", [11], 9, [0, 1, 2], True, greedy),
        ScheduledSegment("b", [30], 6, [3, 4], True, greedy),
        ScheduledSegment("c", [40, 41, 42, 43], 8, [0, 1, 5], True, greedy),
        ScheduledSegment("d", [7, 6, 5], 0, [6], True, greedy)])[1]


def assert_owned_matches_transformers(path: Any, dtype: Any, owned_class: Any) -> None:
    """The runner with its owned model (``owned_class``) and the one whose owned model is not
    built (transformers' forward over the same products) decode the same greedy tokens and
    give a mixed step's logits within float tolerance (bf16: its rounding)."""
    import torch

    from langchain_ascend.testing.runner_steps import greedy_decode

    owned = prepared_runner(path, dtype)
    plain = prepared_runner(path, dtype, without=[(owned_class, "build", None)])
    assert isinstance(owned.hooks.owned_model, owned_class) and plain.hooks.owned_model is None
    assert plain.weights["forward"] == "transformers"
    tokens = {name: greedy_decode(r, PROMPTS, 6, blocks_per_request=6)
              for name, r in (("owned", owned), ("plain", plain))}
    assert tokens["owned"] == tokens["plain"]
    logits = {name: mixed_step_logits(r) for name, r in (("owned", owned), ("plain", plain))}
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(logits["owned"], logits["plain"], atol=tol, rtol=tol)
