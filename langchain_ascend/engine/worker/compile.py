"""Optional compiled decode step, with an eager fallback that never fails a request.

``compile="auto"`` currently means OFF on every device: on the CPU compiling took about a
minute and the compiled step was no faster (the step streams weights, which compiling does not
change; figures in ``docs/performance.md``); on CUDA / NPU the benefit is unproven, since the
step metadata still carries host integers (span bounds, lengths) dynamo would specialise on.

``compile=True`` opts in on any device with a compile backend: steps made only of decodes go
through ``torch.compile(forward, backend=platform.compile_backend(device), dynamic=True)``,
one compiled callable per batch-size bucket (1, 2, 4, ...). Any exception while compiling or
running a compiled step logs a warning, disables compilation for good and reruns the step
eagerly; the cache writes of a failed attempt are repeated with the same values, so the retry
is harmless.

Not done yet: full graph capture (CUDA graphs / ACLGraph via ``npugraph_ex``) needs
shape-stable step metadata (batch padded to the bucket on the scratch block, block tables
padded to a fixed width, sequence lengths as device tensors); ``ModelRunner`` already keeps a
scratch block for that padding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform

if TYPE_CHECKING:
    import torch

    from langchain_ascend.attention.backends.base import BatchLayout

logger = logging.getLogger(__name__)


def resolve_compile(mode: bool | str, device: torch.device) -> bool:
    """Whether to compile the decode step for ``mode`` (``"auto"``, True, False) on ``device``.

    Raises:
        ValueError: ``mode`` is none of those.
    """
    if mode == "auto":
        return False  # no device where it is shown to pay off yet (module docstring)
    if isinstance(mode, bool):
        return mode and platform.compile_backend(device) is not None
    raise ValueError(f"compile must be 'auto', True or False, got {mode!r}")


def batch_bucket(batch_size: int) -> int:
    """The power-of-two bucket a decode batch of ``batch_size`` is compiled for."""
    bucket = 1
    while bucket < batch_size:
        bucket *= 2
    return bucket


class StepCompiler:
    """Runs the model forward eagerly, or compiled for pure-decode steps when enabled.

    Args:
        forward: ``forward(input_ids, position_ids, sample_rows, step) -> logits``.
        device: Where the model runs (picks the compile backend).
        mode: ``"auto"``, True or False (see :func:`resolve_compile`).
        compile_fn: Turns ``forward`` into its compiled form; default
            ``torch.compile(forward, backend=platform.compile_backend(device), dynamic=True)``.
    """

    def __init__(self, forward: Callable[..., Any], *, device: torch.device,
                 mode: bool | str = "auto",
                 compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
                 ) -> None:
        self.forward = forward
        self.device = device
        self.enabled = resolve_compile(mode, device) if compile_fn is None else mode is not False
        self.compile_fn = compile_fn or self._torch_compile
        self.bucket_to_fn: dict[int, Callable[..., Any]] = {}
        self.failure: str | None = None

    def _torch_compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        backend = platform.compile_backend(self.device) or "inductor"
        return torch.compile(fn, backend=backend, dynamic=True)

    def run(self, input_ids: torch.Tensor, position_ids: torch.Tensor, sample_rows: torch.Tensor,
            step: Any, layout: BatchLayout) -> torch.Tensor:
        """Logits of ``sample_rows`` for the packed step (compiled when possible)."""
        if not self.enabled or layout.num_decodes != layout.num_segments:
            return self.forward(input_ids, position_ids, sample_rows, step)
        try:
            return self._compiled(layout.num_segments)(input_ids, position_ids, sample_rows, step)
        except Exception as exc:  # noqa: BLE001 - any compile problem means: run eagerly
            self.enabled = False
            self.failure = f"{type(exc).__name__}: {exc}"
            logger.warning("compiled decode step failed, running eagerly from now on: %s",
                           self.failure)
            return self.forward(input_ids, position_ids, sample_rows, step)

    def _compiled(self, batch_size: int) -> Callable[..., Any]:
        bucket = batch_bucket(batch_size)
        fn = self.bucket_to_fn.get(bucket)
        if fn is None:
            fn = self.compile_fn(self.forward)
            self.bucket_to_fn[bucket] = fn
        return fn

    def warmup(self, runner: Any, block_ids: list[int]) -> None:
        """Compile the smallest decode bucket ahead of the first request (when enabled).

        ``block_ids`` must be a scratch block with room for two tokens.
        """
        if not self.enabled:
            return
        from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
        from langchain_ascend.engine.core.sampling_params import SamplingParams

        segment = ScheduledSegment("__warmup__", [0], 1, block_ids, True, SamplingParams())
        runner.execute(ScheduledBatch(segments=[segment]))
