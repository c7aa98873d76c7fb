"""Graph capture of the static decode step, one graph per bucket, replayed for pure decodes.

Same structure on CUDA (``torch.cuda.CUDAGraph`` / ``torch.cuda.graph``) and Ascend
(``torch.npu.NPUGraph`` / ``torch.npu.graph``; see ASCEND_API.md), reached through a
:class:`~langchain_ascend.platform.GraphAPI` so the CPU tests can drive it with a fake:

* every bucket of :attr:`StaticDecodeStep.buckets` is captured, largest first, into ONE
  shared memory pool (smaller graphs reuse the largest one's memory);
* before a bucket's capture the step runs once eagerly on padding (lazy initialisation and
  allocator warm-up happen outside the capture); the capture runs
  :meth:`StaticDecodeStep.step_fn` over the bucket's persistent views and copies its logits
  into one persistent ``(Bmax, V)`` buffer, so a replay's result is always at the same address;
* a capture that raises logs ONE warning naming the bucket and the error, and that bucket runs
  the static step eagerly from then on;
* a replay reads whatever :meth:`StaticDecodeStep.stage` copied into the buffers last.

The NPU half is untested on hardware (written from torch_npu's ``torch_npu/npu/graphs.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from langchain_ascend.engine.worker.static_step import Bucket, StaticDecodeStep
    from langchain_ascend.platform import GraphAPI

logger = logging.getLogger(__name__)


class DecodeGraphs:
    """The captured graphs of one static step.

    Args:
        static: The step whose buffers and function are captured.
        api: The device's graph API.

    Attributes:
        graphs: The captured graph of each bucket.
        failures: Why a bucket's capture failed (those buckets run eagerly).
        capture_order: Buckets in the order they were captured.
        logits: ``(Bmax, V)`` persistent output of every graph (None before capture).
        pool: The shared memory-pool handle.
    """

    def __init__(self, static: StaticDecodeStep, api: GraphAPI) -> None:
        self.static = static
        self.api = api
        self.graphs: dict[Bucket, Any] = {}
        self.failures: dict[Bucket, str] = {}
        self.capture_order: list[Bucket] = []
        self.logits: torch.Tensor | None = None
        self.pool: Any = None
        self.captured = False

    def capture_all(self, *, progress: bool = True) -> None:
        """Capture every bucket, largest first (idempotent)."""
        if self.captured:
            return
        from tqdm.auto import tqdm

        self.captured = True
        self.pool = self.api.pool_handle()
        buckets = self.static.buckets
        for key in tqdm(buckets, desc="capturing decode graphs", unit="graph",
                        disable=not progress):
            self.capture(key)
        self.api.synchronize()
        logger.info("decode graphs: %d captured, %d eager after a failed capture",
                    len(self.graphs), len(self.failures))

    def capture(self, key: Bucket) -> None:
        """Capture one bucket (an eager run first, then the capture)."""
        import torch

        static = self.static
        static.stage(key)  # padding only: the contents do not matter to a capture
        out = static.run(key)  # (B, V), outside the capture
        if self.logits is None:
            self.logits = torch.empty((static.max_batch, out.shape[-1]), dtype=out.dtype,
                                      device=out.device)
        self.api.synchronize()
        graph = self.api.new_graph()
        try:
            with self.api.graph(graph, pool=self.pool):
                captured = static.step_fn(*static.views(key))  # (B, V)
                self.logits[: key[0]].copy_(captured)
        except Exception as exc:  # noqa: BLE001 - a failed capture means: this bucket is eager
            self.failures[key] = f"{type(exc).__name__}: {exc}"
            logger.warning("capturing the decode step for %d rows x %d blocks failed, that "
                           "bucket runs eagerly: %s", key[0], key[1], self.failures[key])
            return
        self.graphs[key] = graph
        self.capture_order.append(key)

    def replay(self, key: Bucket) -> torch.Tensor | None:
        """``(B, V)`` logits of the staged step by replaying ``key``'s graph, or None when the
        bucket has no graph."""
        graph = self.graphs.get(key)
        if graph is None or self.logits is None:
            return None
        graph.replay()
        return self.logits[: key[0]]
