"""The device K/V tensors of the paged cache, shaped by the attention backend.

One tensor per decoder layer, allocated once and updated in place. Block ids handed out by the
host-side block pool index dimension ``backend.blocks_dim`` of every layer's tensor. The cache
is zero-filled so that padding gathered by batched attention is finite (masked scores times a
NaN value would still be NaN). On the CPU the zeros are the kernel's: each layer's tensor lies
in an anonymous memory map, whose pages are zero and become resident only when first written,
so untouched blocks cost no RAM (``torch.zeros`` writes every byte: SmolLM2's default 2 GiB
pool was all resident, and took seconds to fill, before the first request).
"""

from __future__ import annotations

import logging
import mmap
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
from langchain_ascend.validation import check_count, check_int, check_probability

if TYPE_CHECKING:
    import torch

    from langchain_ascend.attention.backends.base import AttentionBackend

logger = logging.getLogger(__name__)

CPU_KV_CACHE_CAP_BYTES = 2 * 1024**3
"""Most memory a CPU KV cache takes when sized from a fraction of free RAM (the model and the
activations need the rest of the host)."""

MIN_NUM_BLOCKS = 2

DEFAULT_MAX_KV_TOKENS = 262_144
"""Most tokens a default-sized KV pool holds (256k), whatever the free memory: a small model
needs no gigabytes of cache, and an untouched pool still ends up resident on the CPU once
the block pool has cycled through it."""


KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
"""``kv_cache_dtype`` settings: ``"auto"`` or the dtype the cache stores keys and values in."""


def resolve_kv_cache_dtype(setting: str | None, *, device: torch.device, dtype: torch.dtype,
                           quantized: bool) -> torch.dtype:
    """The dtype the KV cache stores (pure function; the backend checks it can read it).

    ``"auto"`` (or None) is float16 for a float32 model with quantized weights on the CPU:
    llama.cpp's cache type, and half the bytes a decode streams per cached token (at a 2k
    context SmolLM2's float32 keys and values outweigh its 4-bit weights); the model's dtype
    everywhere else, so a float model's text stays exactly the float model's.

    Raises:
        ValueError: ``setting`` is not one of :data:`KV_CACHE_DTYPES`.
    """
    import torch

    if setting is None or setting == "auto":
        if quantized and dtype == torch.float32 and platform.device_type(device) == "cpu":
            return torch.float16
        return dtype
    if setting not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                         f"not {setting!r}")
    return getattr(torch, setting)


def plan_num_blocks(*, device: torch.device, bytes_per_block: int,
                    memory_fraction: float, num_blocks: int | None = None,
                    cpu_cap_bytes: int = CPU_KV_CACHE_CAP_BYTES,
                    block_size: int | None = None, max_num_tokens: int | None = None) -> int:
    """How many KV blocks to allocate.

    An explicit ``num_blocks`` is used as is. Otherwise the pool is the smallest of:

    - ``memory_fraction`` of the currently free device memory (host RAM on CPU, where it is
      also at most ``cpu_cap_bytes``);
    - when ``block_size`` is given, enough blocks for ``max_num_tokens`` tokens (the engine
      passes ``max_batch_size x max_context_length``: every request of a full batch at its
      longest), and never more than :data:`DEFAULT_MAX_KV_TOKENS` tokens.

    So a 1M-parameter test model gets a pool of a few MiB instead of half the RAM, and a
    large model on a large device still stops at 256k tokens unless ``num_blocks`` asks for
    more.

    Args:
        device: Where the cache lives.
        bytes_per_block: One block across all layers (``AttentionBackend.bytes_per_block``).
        memory_fraction: Share of the currently free device memory (host RAM on CPU) to use,
            in (0, 1].
        num_blocks: Explicit count; wins over every default bound when given.
        cpu_cap_bytes: Upper bound for a fraction-sized cache on CPU.
        block_size: Tokens per block; without it the token caps do not apply.
        max_num_tokens: Tokens the pool needs at most (capped at
            :data:`DEFAULT_MAX_KV_TOKENS`); None: that cap alone.

    Returns:
        The number of blocks (at least :data:`MIN_NUM_BLOCKS`).

    Raises:
        ValueError: Bad ``num_blocks`` / ``memory_fraction`` / ``max_num_tokens``, or too
            little memory.
    """
    if num_blocks is not None:
        return check_int("num_blocks", num_blocks, minimum=MIN_NUM_BLOCKS)
    check_probability("kv_cache_memory_fraction", memory_fraction, open_min=True)
    budget = int(platform.memory_info(device).free * memory_fraction)
    if platform.device_type(device) == "cpu":
        budget = min(budget, cpu_cap_bytes)
    planned = budget // bytes_per_block
    if planned < MIN_NUM_BLOCKS:
        raise ValueError(
            f"not enough free memory on {device} for a KV cache: {budget} bytes allowed by "
            f"kv_cache_memory_fraction={memory_fraction}, one block needs {bytes_per_block}")
    if block_size is not None:
        check_count("max_num_tokens", max_num_tokens, allow_none=True)
        tokens = min(DEFAULT_MAX_KV_TOKENS, max_num_tokens or DEFAULT_MAX_KV_TOKENS)
        planned = min(planned, max(MIN_NUM_BLOCKS, -(-tokens // block_size)))
    return planned


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """A zero tensor; on the CPU its pages are mapped on first write (module docstring)."""
    import torch

    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    if num_bytes == 0:
        return torch.zeros(shape, dtype=dtype)
    # Private and anonymous: zero, not resident until written, not shared with a forked child.
    pages = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE)
    # The tensor keeps the map alive (frombuffer holds a reference to its buffer).
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)


class KVCache:
    """Per-layer paged K/V tensors.

    Args:
        backend: Decides each layer's tensor shape (``backend.kv_cache_shape``).
        num_layers: Decoder layers of the model.
        num_blocks: Blocks in the pool.
        block_size: Tokens per block.

    Attributes:
        tensors: One cache tensor per layer, on ``backend.device`` with
            ``backend.cache_dtype``.
    """

    def __init__(self, backend: AttentionBackend, *, num_layers: int, num_blocks: int,
                 block_size: int) -> None:

        backend.check_block_size(block_size)
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = backend.kv_cache_shape(num_blocks, block_size)
        self.tensors: list[torch.Tensor] = [
            lazy_zeros(shape, backend.cache_dtype, backend.device) for _ in range(num_layers)]
        self.blocks_dim = backend.blocks_dim
        self.num_bytes = sum(t.numel() * t.element_size() for t in self.tensors)
        logger.info("KV cache: %d blocks x %d tokens, %d layers, %.1f MiB on %s", num_blocks,
                    block_size, num_layers, self.num_bytes / 2**20, backend.device)

    @property
    def num_slots(self) -> int:
        """Token slots in the pool."""
        return self.num_blocks * self.block_size

    def block(self, layer: int, block_id: int) -> torch.Tensor:
        """A view of one block of one layer (keys and values), whatever the backend's layout."""
        return self.tensors[layer].select(self.blocks_dim, block_id)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block ``src``'s keys and values into block ``dst``, every layer."""
        for layer in range(self.num_layers):
            self.block(layer, dst).copy_(self.block(layer, src))
