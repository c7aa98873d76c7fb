"""The per-op pieces of an owned CPU model's layer, over our native kernels: pure functions.

Every step an owned model runs outside the native decode stack (prefills of several requests,
mixed steps, more rows than the stack takes) goes through these, layer by layer; the stack
(``native.decode_stack.c``) runs the same kernels for a pure-decode step or a lone prefill
segment, so a row's values do not depend on which of the two ran its step:

* :func:`rms_norm`: the native one-pass RMSNorm (float32), or the bf16 kernel in transformers'
  rounding order; ``F.rms_norm`` where neither is built;
* :func:`rotary_tables`: ``cos``/``sin`` of the positions, as transformers' rotary embedding
  computes them (an outer product of the positions and the inverse frequencies, exact), and
  :class:`RotaryTable`, the same values of every position computed once and looked up;
* :func:`attend`: rotate q/k and write k/v into the paged cache in one native call
  (``native.rope_kv``), then the CPU backend's paged attention;
* :func:`mlp`: ``down(act(gate(x)) * up(x))`` over a fused gate/up product, in row chunks for
  a long prefill, ``act`` SiLU or Gemma's tanh GELU; a quantized product's SiLU is the stack's
  own code (``stack_kernel.silu_mul``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
from langchain_ascend.native import rms_norm as native_rms_norm
from langchain_ascend.native import rope_kv
from langchain_ascend.native import stack_kernel as native_stack

if TYPE_CHECKING:
    import torch

MLP_CHUNK_BYTES = 16 << 20
"""The most float32 gate/up intermediate a prefill's MLP makes at a time: at Llama-3.2-1B's
width 1,024 rows make 64 MB, which leaves the last-level cache between the three steps (about
11% of the MLP's time, docs/performance.md); 16 MB (256 rows there) stays near. Rows are
independent, so the bits do not depend on the chunking."""


def runs_step(input_ids: torch.Tensor, step: Any, dtype: torch.dtype) -> bool:
    """Whether an owned model of ``dtype`` activations runs the step of ``input_ids``
    ``(1, T)``: any step of the CPU backend's paged path whose cache the rotary kernel
    writes (other backends' steps run transformers' forward)."""
    return (step is not None and isinstance(step.backend, TorchRefBackend)
            and input_ids.dim() == 2 and input_ids.shape[0] == 1
            and rope_kv.available(dtype, step.kv_caches[0].dtype))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x * rsqrt(mean(x^2) + eps)`` over the last dim of ``x`` ``(..., D)``: every
    row through the native kernel (a decoding row gets the stack's bits even beside a
    prefill), in ``x``'s dtype."""
    import torch
    import torch.nn.functional as F

    if weight.dtype == torch.bfloat16:
        out = native_rms_norm.rms_norm_bf16(x, weight, eps, max_rows=None)
        if out is not None:
            return out
        # transformers' rounding: normalise in float32, round, scale by the bf16 weight
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * normed.to(x.dtype)
    out = native_rms_norm.rms_norm(x, weight, eps, max_rows=None)
    if out is not None:
        return out
    return F.rms_norm(x, weight.shape, weight, eps)


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``(T, Dh)`` of ``positions`` ``(T,)``: ``freqs = positions x inv_freq``
    ``(T, Dh/2)`` (one product each: exact, as transformers' batched matmul over a 1-wide
    inner dim), repeated twice, times the rope's attention ``scaling``, cast to ``dtype``."""
    import torch

    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, Dh)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


class RotaryTable:
    """``cos``/``sin`` of positions looked up in a table of :func:`rotary_tables` over every
    position up to the longest one seen (grown by doubling, at least :attr:`MIN_POSITIONS`).

    Per step, :func:`rotary_tables` costs ~40 us of small torch ops, about 1% of a SmolLM2
    decode step; the lookup ~10 us. A position's values are its own element-wise ops, so the
    table holds what a step computed for it, and prefill and decode rows read the same bits.

    Attributes:
        inv_freq: ``(Dh/2,)`` inverse frequencies; ``scaling``: the attention factor;
            ``dtype``: the tables' dtype.
        cos, sin: ``(P, Dh)`` tables of positions ``0..P-1`` (None before the first lookup).
    """

    MIN_POSITIONS = 256

    def __init__(self, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype) -> None:
        self.inv_freq, self.scaling, self.dtype = inv_freq, scaling, dtype
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``(T, Dh)`` of ``positions`` ``(T,)`` int64 (non-negative)."""
        import torch

        last = int(positions.max()) if positions.numel() else 0
        if self.cos is None or self.sin is None or last >= self.cos.shape[0]:
            size = max(self.MIN_POSITIONS, 1 << last.bit_length())  # > last
            self.cos, self.sin = rotary_tables(torch.arange(size), self.inv_freq, self.scaling,
                                               self.dtype)  # (P, Dh) each
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor, step: Any, layer: int, scale: float,
           window: int | None, softcap: float | None = None) -> torch.Tensor:
    """Attention of one layer within the paged ``step``: ``query`` ``(T, H, D)``, ``key`` /
    ``value`` ``(T, KVH, D)`` (un-rotated), ``cos`` / ``sin`` ``(T, D)``; writes the layer's
    K/V and returns ``(T, H, D)``. ``softcap``: Gemma 2's cap on the scaled scores.

    Raises:
        RuntimeError: The native rotary kernel does not take these tensors (the owned model
            is only built where it does: ``rope_kv.available``).
    """
    kv_cache = step.kv_caches[layer]
    rotated = rope_kv.rope_and_write(query, key, value, cos, sin, step.metadata.slot_mapping,
                                     kv_cache)
    if rotated is None:
        raise RuntimeError(f"the native rotary kernel does not take layer {layer}'s "
                           f"{query.dtype} rows with a {kv_cache.dtype} cache")
    query, key = rotated
    return step.backend.attend(query, key, value, kv_cache, step.metadata, scale, window,
                               softcap)


def mlp_row_chunk(gate_up_width: int) -> int:
    """Rows of a prefill's MLP run at a time for a gate/up product ``gate_up_width`` wide: a
    multiple of 64 (the product kernel's row block) whose intermediate fits
    :data:`MLP_CHUNK_BYTES`, at least 64."""
    return max(64, MLP_CHUNK_BYTES // (4 * max(gate_up_width, 1)) // 64 * 64)


ACTIVATIONS = ("silu", "gelu_tanh")
"""The MLP activations :func:`mlp` applies: SiLU (Llama-style), tanh-approximated GELU
(Gemma's ``gelu_pytorch_tanh``)."""


def mlp(x: torch.Tensor, gate_up: Any, down: Any, intermediate: int,
        native_silu: bool, activation: str = "silu") -> torch.Tensor:
    """``down(act(gate) * up)`` of ``x`` ``(M, D)`` with ``gate_up(x)`` ``(M, 2I)`` (gate
    rows first), ``act`` one of :data:`ACTIVATIONS`, by :func:`mlp_row_chunk` rows;
    ``native_silu``: the stack's SiLU code (a quantized product's row then has the stack's
    bits; torch's SiLU differs in the last float32 bit)."""
    import torch

    chunk = mlp_row_chunk(2 * intermediate)
    if x.shape[0] <= chunk:
        return _mlp_rows(x, gate_up, down, intermediate, native_silu, activation)
    return torch.cat([_mlp_rows(part, gate_up, down, intermediate, native_silu, activation)
                      for part in x.split(chunk)])  # (M, D)


def _mlp_rows(x: torch.Tensor, gate_up: Any, down: Any, intermediate: int,
              native_silu: bool, activation: str = "silu") -> torch.Tensor:
    import torch.nn.functional as F

    both = gate_up.forward(x)  # (M, 2I)
    if native_silu and activation == "silu":
        act = native_stack.silu_mul(both)  # (M, I)
        if act is not None:
            return down.forward(act)
    gate, up = both.split([intermediate, intermediate], dim=-1)  # (M, I) each
    if activation == "gelu_tanh":
        return down.forward(F.gelu(gate, approximate="tanh") * up)
    return down.forward(F.silu(gate) * up)
