"""The only per-step device code: scheduled segments -> one packed forward -> sampled tokens.

Every step runs the unchanged transformers model ONCE on a packed batch: ``input_ids (1, T)``
holds the new tokens of all scheduled requests end to end (single-token decodes first, a
speculative verify pass's rows among them, then prefill chunks: ``packing``),
``position_ids (1, T)`` their absolute positions. No HF cache object is passed
(``use_cache=False``); our attention function (registered in transformers'
``AttentionInterface``) writes each layer's K/V into the paged cache and attends over it,
driven by the step metadata passed as a keyword argument. Only the hidden states of the
positions that sample reach the LM head (``logits_to_keep``), so a long prefill never builds
a ``(T, vocab)`` logits matrix.

Where preparing the model gave an owned model (``hooks.owned_model``: on the CPU
``engine.cpu.models.llama.LlamaModel`` for the Llama-style families and Phi-3,
``engine.cpu.models.gemma.GemmaModel`` for Gemma 2/3), the steps it accepts
(every step of the CPU backend's paged path) run through it instead of the HF forward,
explicitly: :meth:`ModelRunner.compute_hidden` and the eager :meth:`ModelRunner.compute_logits`
ask it first.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_ascend import families, platform
from langchain_ascend.attention import registry
from langchain_ascend.attention.backends import backend_name_for, get_backend_class
from langchain_ascend.attention.backends.base import BatchLayout
from langchain_ascend.engine import hf_config
from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.speculation import accept_drafts
from langchain_ascend.engine.cpu.models.llama_weights import (
    LlamaWeights,
    OwnedModelUnavailable,
    owned_gguf_config,
)
from langchain_ascend.engine.worker import draft_cost
from langchain_ascend.engine.worker.compile import StepCompiler, resolve_plan
from langchain_ascend.engine.worker.hooks import HookOptions, ModelHooks, prepare_hooks
from langchain_ascend.engine.worker.kv_cache import (
    KVCache,
    plan_num_blocks,
    resolve_kv_cache_dtype,
)
from langchain_ascend.engine.worker.packing import pack
from langchain_ascend.engine.worker.sampler import Sampler
from langchain_ascend.engine.worker.static_step import StaticDecodeStep
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.quant.load import load_causal_lm
from langchain_ascend.quant.quantize_model import weight_summary

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def _check_drafts(segments: Sequence[ScheduledSegment]) -> None:
    """Drafted tokens come only on sampling, greedy, unpenalized segments (``batch``)."""
    for seg in segments:
        drafts = seg.draft_token_ids
        if drafts and (not seg.sample or not seg.sampling.greedy or seg.sampling.has_penalties
                       or len(drafts) >= len(seg.token_ids)
                       or seg.token_ids[len(seg.token_ids) - len(drafts):] != drafts):
            raise ValueError(f"request {seg.request_id!r}: drafted tokens need a sampling, "
                             "greedy, unpenalized segment that ends with them")


def _constrained_verifies(segments: Sequence[ScheduledSegment], sample_indices: Sequence[int],
                          row_counts: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``(first_row, drafts)`` of the step's constrained segments with drafts, whose rows the
    sampler verifies one after another under the grammar."""
    verifies, first = [], 0
    for i, count in zip(sample_indices, row_counts, strict=True):
        seg = segments[i]
        if seg.draft_token_ids and seg.sampling.constraint is not None:
            verifies.append((first, seg.draft_token_ids))
        first += count
    return verifies


def _without_autocast(device_type: str) -> contextlib.AbstractContextManager[object]:
    """The model runs in its own dtype even when the calling thread has autocast on (on the
    CPU a synchronous caller's thread runs the steps itself, see ``engine.driver``)."""
    import torch

    try:
        enabled = torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # an older torch, or a device type it does not know
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False) if enabled else contextlib.nullcontext()


class ModelRunner:
    """Owns the model, the paged KV cache, the attention backend and the sampler.

    Build one with :meth:`load` (from a folder) or :meth:`from_model` (an in-memory model).

    Attributes:
        model: The transformers causal LM (unchanged, attention routed to our function).
        config: ``model.config``.
        device: Where everything runs.
        dtype: Weights and KV cache dtype.
        block_size: Tokens per KV block.
        num_blocks: Usable KV blocks (block ids ``0 .. num_blocks - 1``).
        max_model_len: ``config.max_position_embeddings``.
        backend: The attention backend.
        kv_cache: The paged K/V tensors.
        sampler: Token selection with per-request generators.
        hooks: What preparing the model for its device did (``engine.worker.hooks``).
        logits_head: Turns a packed step into logits or tokens (``hooks.make_logits_head``:
            the model's own head, or a device's cheaper one for some rows).
        weights: The weights' format and bytes (``quant.quantize_model.weight_summary``), the
            KV cache dtype and ``forward``: ``"native"`` where our owned CPU model runs the
            steps, ``"transformers"`` where transformers' forward runs every step
            (``langchain_ascend.families``).
    """

    def __init__(self, model: Any, *, backend: Any, kv_cache: KVCache,
                 max_num_batched_tokens: int = 2048, max_batch_size: int = 64,
                 compile: bool | str = "auto", hooks: ModelHooks | None = None) -> None:
        self.model = model
        self.config = model.config
        self.device = backend.device
        self.dtype = backend.dtype
        self.backend = backend
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.num_blocks = kv_cache.num_blocks - 1  # the last block is scratch (warmup, padding)
        self.scratch_block_id = kv_cache.num_blocks - 1
        self.max_model_len = hf_config.max_position_embeddings(self.config)
        self.vocab_size = int(hf_config.text_config(self.config).vocab_size)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_batch_size = max_batch_size
        self.sampler = Sampler(self.device)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.static = (StaticDecodeStep(
            model, kv_caches=kv_cache.tensors, blocks_dim=kv_cache.blocks_dim,
            block_size=self.block_size, scratch_block_id=self.scratch_block_id,
            max_batch_size=max_batch_size, max_model_len=self.max_model_len,
            device=self.device) if resolve_plan(compile, self.device) != "eager" else None)
        self.compiler = StepCompiler(self.static, device=self.device, mode=compile)
        self.hooks = ModelHooks() if hooks is None else hooks
        self.logits_head = self.hooks.make_logits_head(model)
        self.weights: dict[str, Any] = {}
        """``quant.quantize_model.weight_summary`` of the model (set by :meth:`from_model`)."""

    @classmethod
    def load(cls, model_path: str, *, device: Any = "auto", dtype: Any = "auto",
             block_size: int | None = None, num_blocks: int | None = None,
             kv_cache_memory_fraction: float = 0.5, max_num_batched_tokens: int = 2048,
             max_batch_size: int = 64, attention_backend: str = "auto",
             compile: bool | str = "auto", weight_layout: str = "auto",
             quantization: str | None = "auto", kv_cache_dtype: str | None = "auto",
             ) -> ModelRunner:
        """Load a causal LM from ``model_path`` with our paged attention and allocate its cache.

        Args:
            model_path: A folder ``AutoModelForCausalLM.from_pretrained`` reads.
            device: ``"auto"``, ``"npu"``, ``"cuda"``, ``"cpu"``... (see ``platform``).
            dtype: ``"auto"`` (bf16/fp16 on accelerators, fp32 on CPU) or a dtype / name.
            block_size: Tokens per KV block; default: the backend's preferred size.
            num_blocks: KV blocks to allocate; default: from ``kv_cache_memory_fraction``.
            kv_cache_memory_fraction: Share of free device memory (host RAM on CPU, capped at
                ``kv_cache.CPU_KV_CACHE_CAP_BYTES``) given to the cache.
            max_num_batched_tokens: Most tokens of one step (sizes warmup).
            max_batch_size: Most requests of one step (sizes compiled buckets).
            attention_backend: ``"auto"`` (npu on NPU, cpu on CPU, torch_ref elsewhere) or a
                backend name.
            compile: ``"auto"`` (graphs captured on CUDA / NPU, eager elsewhere: on the CPU the
                owned model's native decode stack), True (captured, or compiled where there
                are no graphs), ``"static"`` (the static step, eager) or False: how
                pure-decode steps run (``engine.worker.compile``).
            weight_layout: How the CPU lays out the linear weights (ignored elsewhere):
                ``"auto"`` (``"dual"`` for float32 when its copies fit: a product picked by
                row count, see ``engine.cpu.weight_layout``), ``"row"``, ``"column"`` or
                ``"dual"``.
            quantization: How the weights are held (``quant.load``): ``"auto"`` (a GGUF-backed
                folder's own blocks, float otherwise), ``"gguf"``, ``"int8"``, ``"int4"``,
                ``"none"`` / None.
            kv_cache_dtype: What the KV cache stores (``kv_cache.resolve_kv_cache_dtype``):
                ``"auto"`` (float16 for quantized weights on the CPU, else the model's dtype),
                ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        """
        resolved_device = platform.resolve_device(device)
        resolved_dtype = platform.resolve_dtype(dtype, resolved_device)
        owned = owned_gguf_config(model_path, device=resolved_device, dtype=resolved_dtype,
                                  attention_backend=attention_backend,
                                  weight_layout=weight_layout, compile=compile)
        settings = dict(block_size=block_size, num_blocks=num_blocks,
                        kv_cache_memory_fraction=kv_cache_memory_fraction,
                        max_num_batched_tokens=max_num_batched_tokens,
                        max_batch_size=max_batch_size, attention_backend=attention_backend,
                        compile=compile, weight_layout=weight_layout,
                        kv_cache_dtype=kv_cache_dtype)
        runner = None
        if owned is not None:  # the owned model's weight tree: no transformers model class
            model, mode = load_causal_lm(model_path, dtype=resolved_dtype,
                                         quantization=quantization, config=owned,
                                         skeleton=LlamaWeights)
            try:
                runner = cls.from_model(model, **settings)
            except OwnedModelUnavailable as exc:  # not expected: owned_gguf_config checked
                logger.warning("%s; loading it through transformers' model class", exc)
                del model
        if runner is None:
            model, mode = load_causal_lm(model_path, dtype=resolved_dtype,
                                         quantization=quantization,
                                         attn_implementation=registry.register())
            model.to(resolved_device)  # type: ignore[arg-type]  # transformers' typed wrapper
            runner = cls.from_model(model, **settings)
        runner.weights["quantization"] = mode
        return runner

    @classmethod
    def from_model(cls, model: Any, *, block_size: int | None = None,
                   num_blocks: int | None = None, kv_cache_memory_fraction: float = 0.5,
                   max_num_batched_tokens: int = 2048, max_batch_size: int = 64,
                   attention_backend: str = "auto", compile: bool | str = "auto",
                   weight_layout: str = "auto",
                   kv_cache_dtype: str | None = "auto") -> ModelRunner:
        """Wrap an already loaded causal LM; its attention is switched to ours.

        The model's device and dtype decide the cache's. Other arguments as in :meth:`load`.
        """
        weights_only = isinstance(model, LlamaWeights)  # no forward: the owned model runs it
        if not weights_only:
            name = registry.register()
            if model.config._attn_implementation != name:
                model.set_attn_implementation(name)
        model.eval()
        first = next(model.parameters())
        device, dtype = first.device, first.dtype
        weights = weight_summary(model)  # before preparing: layouts add copies, not weights
        hooks = prepare_hooks(model, device=device, dtype=dtype,
                              options=HookOptions(weight_layout=weight_layout))
        if weights_only and hooks.owned_model is None:
            raise OwnedModelUnavailable("the owned CPU model could not be built over this GGUF "
                                        "model's weights (the log says why)")
        num_layers, num_heads, num_kv_heads, head_dim = hf_config.attention_geometry(model.config)
        backend_cls = get_backend_class(
            backend_name_for(platform.device_type(device), attention_backend))
        geometry = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
                    "dtype": dtype, "device": device}
        cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, device=device, dtype=dtype,
                                             quantized=bool(weights["quantized_bytes"]))
        try:
            backend = backend_cls(**geometry, cache_dtype=cache_dtype)
        except ValueError:
            if kv_cache_dtype not in (None, "auto"):
                raise
            backend = backend_cls(**geometry)  # "auto": the model's dtype where no kernel reads
        registry.check_backend_runs(backend, model.config)  # Gemma 2's soft-cap, at start
        block_size = block_size or backend_cls.preferred_block_size()
        backend_cls.check_block_size(block_size)
        usable = plan_num_blocks(device=device, bytes_per_block=backend.bytes_per_block(
            block_size, num_layers), memory_fraction=kv_cache_memory_fraction,
            num_blocks=num_blocks)
        kv_cache = KVCache(backend, num_layers=num_layers, num_blocks=usable + 1,
                           block_size=block_size)
        runner = cls(model, backend=backend, kv_cache=kv_cache,
                     max_num_batched_tokens=max_num_batched_tokens,
                     max_batch_size=max_batch_size, compile=compile, hooks=hooks)
        runner.weights = weights
        runner.weights["kv_cache_dtype"] = str(backend.cache_dtype).removeprefix("torch.")
        runner.weights["forward"] = (families.NATIVE_FORWARD if hooks.owned_model is not None
                                     else families.TRANSFORMERS_FORWARD)  # what decodes
        return runner

    def execute(self, batch: ScheduledBatch) -> list[int | list[int] | None]:
        """Run one step: one packed forward over all segments, then sample.

        Args:
            batch: The scheduler's step. ``finished_ids`` are released first.

        Returns:
            One entry per segment, in ``batch.segments`` order: the sampled token id; for a
            segment with drafts, the verified tokens (``engine.core.speculation.accept_drafts``);
            None where ``sample`` is False.

        Raises:
            InvalidRequestError: A token id is outside the vocabulary.
            ValueError: The batch breaks the :class:`ScheduledSegment` invariants.
        """
        import torch

        if batch.finished_ids:
            self.release(batch.finished_ids)
        segments = batch.segments
        results: list[int | list[int] | None] = [None] * len(segments)
        if not segments:
            return results
        with torch.inference_mode():  # constraints edit the (inference-mode) logits in place
            sample_indices, packed = self._pack(segments)
            # One row per sampled position: a segment with k drafts samples k + 1 rows.
            row_counts = [1 + len(segments[i].draft_token_ids) for i in sample_indices]
            row_segments = [segments[i] for i, n in zip(sample_indices, row_counts, strict=True)
                            for _ in range(n)]
            params = [seg.sampling for seg in row_segments]
            tokens, logits = self.logits_head.run(self, packed, params)
            if tokens is None:
                if sample_indices:
                    assert logits is not None  # a head that chose no tokens gives logits
                    tokens = self.sampler.sample(
                        logits, params, [seg.request_id for seg in row_segments],
                        [(seg.prompt_token_ids, seg.output_token_ids) for seg in row_segments],
                        verify=_constrained_verifies(segments, sample_indices, row_counts))
                else:
                    tokens = []
            start = 0
            for i, count in zip(sample_indices, row_counts, strict=True):
                chosen = tokens[start:start + count]
                start += count
                drafts = segments[i].draft_token_ids
                results[i] = accept_drafts(drafts, chosen) if drafts else chosen[0]
        return results

    def _pack(self, segments: Sequence[ScheduledSegment],
              ) -> tuple[list[int], tuple[BatchLayout, list[int], list[int], list[int]]]:
        """``(sample_indices, (layout, input_ids, positions, sample_rows))`` of a step."""
        self._check_token_ids(segments)
        _check_drafts(segments)
        # A verify pass's rows are packed as the decodes they stand for (``packing``).
        packed = pack(segments, self.block_size, range(len(segments)))
        return packed.sample_indices, (packed.layout, packed.input_ids, packed.positions,
                                       packed.sample_rows)

    def forward_batch(self, segments: Sequence[ScheduledSegment]) -> tuple[list[int], Any]:
        """The packed forward of one step, without sampling.

        Returns:
            ``(sample_indices, logits)``: the indices into ``segments`` of the segments with
            ``sample=True`` and their ``(len(sample_indices), vocab)`` next-token logits, row
            ``k`` belonging to ``segments[sample_indices[k]]``.
        """
        if not segments:
            return [], None
        sample_indices, packed = self._pack(segments)
        return sample_indices, self.compute_logits(*packed)

    def compute_hidden(self, layout: BatchLayout, input_ids: list[int], positions: list[int],
                       sample_rows: list[int]) -> torch.Tensor:
        """Packed forward of the decoder only: ``(len(sample_rows), hidden)`` final hidden
        states of the given tokens (for a logits head that applies the LM head itself)."""
        import torch

        ints, rows, step = self._step_inputs(layout, input_ids, positions, sample_rows)
        with torch.inference_mode(), _without_autocast(self.device.type):
            hidden = self._owned_hidden(ints[0:1], ints[1:2], step)
            if hidden is None:
                hidden = self.model.get_decoder()(
                    input_ids=ints[0:1], position_ids=ints[1:2], use_cache=False,
                    **{registry.STEP_KWARG: step}).last_hidden_state  # (1, T, hidden)
            return hidden[0, rows]  # (S, hidden)

    def _owned_hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                      step: registry.PagedAttentionStep) -> torch.Tensor | None:
        """``(1, T, hidden)`` from the owned model (``hooks.owned_model``) where it runs this
        step (``(1, T)`` ids and positions), else None: the HF forward runs it."""
        owned = self.hooks.owned_model
        if owned is None or not owned.can_run(input_ids, step):
            return None
        return owned.hidden(input_ids, position_ids, step)

    def compute_logits(self, layout: BatchLayout, input_ids: list[int], positions: list[int],
                       sample_rows: list[int]) -> torch.Tensor:
        """Packed forward; returns ``(len(sample_rows), vocab)`` logits of the given tokens."""
        import torch

        with torch.inference_mode(), _without_autocast(self.device.type):
            logits = self.compiler.run(layout, input_ids, positions, sample_rows)
            if logits is not None:
                return logits  # (S, V) from the static decode step
            ints, rows, step = self._step_inputs(layout, input_ids, positions, sample_rows)
            return self._forward(ints[0:1], ints[1:2], rows, step)

    def _step_inputs(self, layout: BatchLayout, input_ids: list[int], positions: list[int],
                     sample_rows: list[int],
                     ) -> tuple[torch.Tensor, torch.Tensor, registry.PagedAttentionStep]:
        """``(ids and positions (2, T), sample rows (S,), attention step)`` on the device."""
        import torch

        ints = torch.tensor([input_ids, positions], dtype=torch.long)  # (2, T)
        rows = torch.tensor(sample_rows, dtype=torch.long)  # (S,)
        if self.device.type != "cpu":
            ints = ints.to(self.device, non_blocking=True)
            rows = rows.to(self.device, non_blocking=True)
        step = registry.PagedAttentionStep(self.backend, self.kv_cache.tensors,
                                           self.backend.build_metadata(layout))
        return ints, rows, step

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 sample_rows: torch.Tensor, step: registry.PagedAttentionStep) -> torch.Tensor:
        """The model call itself: ``(1, T)`` ids and positions -> ``(S, V)`` logits (the step
        owned model's where it runs the step)."""
        hidden = self._owned_hidden(input_ids, position_ids, step)  # (1, T, hidden)
        if hidden is not None:
            assert self.hooks.owned_model is not None
            return self.hooks.owned_model.logits(hidden, sample_rows)  # (S, V)
        kwargs = {registry.STEP_KWARG: step}
        if self._keeps_logits:
            out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                             logits_to_keep=sample_rows, **kwargs)
            return out.logits[0]  # (S, V)
        out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **kwargs)
        return out.logits[0, sample_rows]  # (S, V)

    def _check_token_ids(self, segments: Sequence[ScheduledSegment]) -> None:
        for seg in segments:
            ids = seg.token_ids
            if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
                raise InvalidRequestError(
                    f"request {seg.request_id!r}: token ids must be in [0, {self.vocab_size}), "
                    f"got {min(ids)}..{max(ids)}")

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one KV block's keys and values into another (the block pool relocates a
        cached prefix block with it)."""
        import torch

        with torch.inference_mode():
            self.kv_cache.copy_block(src, dst)

    def release(self, request_ids: Iterable[str]) -> None:
        """Drop per-request state (sampling generators) of finished/aborted requests."""
        self.sampler.release(request_ids)

    def draft_row_cost(self) -> float:
        """What one more query row costs in a decode pass, in units of a one-row pass, measured
        once per model and machine (:func:`engine.worker.draft_cost.cached`)."""
        return draft_cost.cached(self)

    def warmup(self) -> None:
        """Run a small prefill and a decode step on the scratch block (touches no real block).

        Brings kernels, allocator pools and (when enabled) the captured decode graphs or the
        smallest compiled bucket up before the first request (``engine.worker.compile``).
        """
        block = [self.scratch_block_id]
        length = max(1, min(self.block_size - 1, 8))
        greedy = SamplingParams(max_tokens=1)
        prefill = ScheduledSegment("__warmup__", [0] * length, 0, block, True, greedy)
        self.execute(ScheduledBatch(segments=[prefill]))
        if length < self.block_size:
            decode = ScheduledSegment("__warmup__", [0], length, block, True, greedy)
            self.execute(ScheduledBatch(segments=[decode]))
            self.compiler.warmup()
        self.release(["__warmup__"])
