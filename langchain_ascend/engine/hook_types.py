"""The types a device-specific preparation and the model runner share: the options, the
hooks record, the logits-head strategy and the step decoder.

A leaf (no package imports at run time), so ``engine.cpu`` (which makes :class:`ModelHooks`)
and ``worker.hooks`` (which calls ``engine.cpu.prepare``) both build on it without importing
each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from langchain_ascend.attention.backends.base import BatchLayout
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    PackedStep = tuple[BatchLayout, list[int], list[int], list[int]]
    """``(layout, input_ids, positions, sample_rows)`` of one packed step."""

__all__ = ["WEIGHT_LAYOUTS", "HookOptions", "LogitsHead", "ModelHooks", "PlainLogitsHead",
           "OwnedModel"]

WEIGHT_LAYOUTS = ("auto", "row", "column", "dual")
"""Accepted ``weight_layout`` values (applied on the CPU, see ``engine.cpu.weight_layout``)."""


class LogitsHead(Protocol):
    """Turns a packed step into its sampled rows' logits, or straight into their tokens."""

    def run(self, runner: Any, packed: PackedStep, params: Sequence[SamplingParams],
            ) -> tuple[list[int] | None, torch.Tensor | None]:
        """``(tokens, None)`` when the head chose the tokens itself, else ``(None, logits)``
        with the ``(S, V)`` logits of the sampled rows for the sampler. Runs the forward
        (which writes the step's K/V) in either case."""
        ...


class PlainLogitsHead:
    """The model's own LM head over the sampled rows; the sampler picks the tokens."""

    def run(self, runner: Any, packed: PackedStep, params: Sequence[SamplingParams],
            ) -> tuple[list[int] | None, torch.Tensor | None]:
        return None, runner.compute_logits(*packed)


class OwnedModel(Protocol):
    """Our own forward of a model over its weights, run instead of the HF forward (the CPU's
    ``engine.cpu.models``: ``llama.LlamaModel``, ``gemma.GemmaModel``); the runner calls it
    for the steps it accepts."""

    def can_run(self, input_ids: torch.Tensor, step: Any) -> bool:
        """Whether the step of ``input_ids`` ``(1, T)`` (paged attention ``step``) is one
        this model runs."""
        ...

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
               step: Any) -> torch.Tensor:
        """``(1, T, D)`` final hidden states of an accepted step, writing its K/V."""
        ...

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``(S, V)`` logits of ``rows`` of :meth:`hidden`'s output."""
        ...


@dataclass(frozen=True)
class HookOptions:
    """How to prepare a model.

    Attributes:
        weight_layout: One of :data:`WEIGHT_LAYOUTS` (the CPU's linear-weight layout).
        screen_greedy: Let plain greedy rows take their token from a cheaper screened head
            where the device has one.
    """

    weight_layout: str = "auto"
    screen_greedy: bool = True

    def __post_init__(self) -> None:
        if self.weight_layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"weight_layout must be one of {WEIGHT_LAYOUTS}, "
                             f"got {self.weight_layout!r}")


@dataclass
class ModelHooks:
    """What preparing a model produced: the plain hooks of a device that needs none.

    Attributes:
        changes: What was done to the model, for logs and tests (empty: nothing).
        owned_model: Our forward of the model, which the runner calls for the steps it can
            run (None: every step runs the HF forward).
    """

    changes: dict[str, Any] = field(default_factory=dict)
    owned_model: OwnedModel | None = None

    def make_logits_head(self, model: Any) -> LogitsHead:
        """The runner's logits-head strategy for ``model``; built by the runner once its KV
        cache is allocated (a head may size a copy by the RAM left)."""
        return PlainLogitsHead()
