"""Read and write single token rows of vLLM's paged KV cache, whatever the block's inner layout.

Tree verification needs two things vLLM's attention kernels do not offer: the cached keys/values of
a request's prefix as plain tensors (for attention under an arbitrary ancestor mask), and moving an
accepted node's keys/values from the slot it was verified in to the slot its position owns.

CPU: the cache is ``[blocks, kv_heads, block_size, 2 * head_size]`` and each (block, head) record
holds ``block_size * head_size`` keys, then as many values, in an order that depends on the kernel
ISA (``vec``: keys transposed, ``amx``: tiled). Rather than hard-coding each order we learn it once
per (isa, dtype, block_size, head_size) by writing coded rows with vLLM's own
``cpu_attn_reshape_and_cache`` into a scratch block and reading back where each element landed.
Writes always go through that same op, so they are right by construction.

CUDA (flash attention, ``[blocks, kv_heads, block_size, 2 * head_size]``, token rows): plain indexing.
"""

from __future__ import annotations

from functools import lru_cache

import torch

# Coded probe values stay exact in every cache dtype we accept (bf16 holds integers up to 256).
_PROBE_BASE = 128
QUANTIZED_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")


@lru_cache(maxsize=None)
def cpu_block_layout(isa: str, dtype: torch.dtype, block_size: int, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([block_size, head_size] offsets of each key element, same for values) inside one
    (block, head) record of ``2 * block_size * head_size`` elements, as the CPU kernel stores them."""
    from vllm import _custom_ops as ops

    token = torch.arange(block_size)[:, None].expand(block_size, head_size)
    dim = torch.arange(head_size)[None, :].expand(block_size, head_size)
    located = []
    for coded in (token % _PROBE_BASE, token // _PROBE_BASE, dim % _PROBE_BASE, dim // _PROBE_BASE):
        cache = torch.zeros(1, 1, block_size, 2 * head_size, dtype=dtype)
        key_cache, value_cache = cache.view(1, 1, 2 * block_size, head_size).chunk(2, dim=2)
        rows = (coded + 1).to(dtype)[:, None, :]  # [tokens, kv_heads=1, head_size]
        ops.cpu_attn_reshape_and_cache(rows, -rows, key_cache, value_cache, torch.arange(block_size), isa)
        located.append(cache.reshape(-1).float())
    record = 2 * block_size * head_size
    offsets = []
    for sign in (1.0, -1.0):
        parts = [(sign * values).round().long() - 1 for values in located]  # -1 where not of this sign
        mine = parts[0] >= 0
        t = parts[0] + _PROBE_BASE * parts[1]
        d = parts[2] + _PROBE_BASE * parts[3]
        where = torch.full((block_size * head_size,), -1, dtype=torch.long)
        where[(t * head_size + d)[mine]] = torch.arange(record)[mine]
        if (where < 0).any() or int(mine.sum()) != block_size * head_size:
            raise RuntimeError(f"could not map the CPU KV block layout for isa={isa!r}, dtype={dtype}")
        offsets.append(where.view(block_size, head_size))
    return offsets[0], offsets[1]


class CpuPagedKV:
    """Token-row access to one CPU attention layer's paged cache."""

    def __init__(self, kv_cache: torch.Tensor, isa: str, kv_cache_dtype: str = "auto"):
        if kv_cache_dtype in QUANTIZED_KV:
            raise NotImplementedError("AdaptiveSpec tree attention needs an unquantized KV cache on CPU")
        self.cache = kv_cache
        self.isa = isa
        self.num_blocks, self.num_kv_heads, self.block_size, twice = kv_cache.shape
        self.head_size = twice // 2
        key_at, value_at = cpu_block_layout(isa, kv_cache.dtype, self.block_size, self.head_size)
        self._key_at = key_at.reshape(-1).to(kv_cache.device)
        self._value_at = value_at.reshape(-1).to(kv_cache.device)

    def _records(self) -> torch.Tensor:
        return self.cache.view(self.num_blocks, self.num_kv_heads, -1)

    def read_blocks(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of whole blocks: ``block_ids`` [...] -> two [..., kv_heads, block_size, head_size]."""
        records = self._records().index_select(0, block_ids.reshape(-1))  # [n, H, record]
        shape = (*block_ids.shape, self.num_kv_heads, self.block_size, self.head_size)
        keys = records.index_select(-1, self._key_at).view(shape)
        values = records.index_select(-1, self._value_at).view(shape)
        return keys, values

    def read_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at ``slots`` [n] -> two [n, kv_heads, head_size]."""
        records = self._records()[slots // self.block_size]  # [n, H, record]
        inner = (slots % self.block_size)[:, None] * self.head_size + torch.arange(self.head_size, device=slots.device)
        n = slots.shape[0]
        key_index = self._key_at[inner][:, None, :].expand(n, self.num_kv_heads, self.head_size)
        value_index = self._value_at[inner][:, None, :].expand(n, self.num_kv_heads, self.head_size)
        return records.gather(-1, key_index), records.gather(-1, value_index)

    def write_slots(self, layer, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        from vllm import _custom_ops as ops

        key_cache, value_cache = self.cache.view(
            self.num_blocks, self.num_kv_heads, 2 * self.block_size, self.head_size
        ).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(
            keys, values, key_cache, value_cache, slots, self.isa,
            k_scale=getattr(layer, "_k_scale_float", 1.0), v_scale=getattr(layer, "_v_scale_float", 1.0),
        )  # fmt: skip


class FlashPagedKV:
    """Token-row access to vLLM 0.32's flash-attention cache ``[blocks, kv_heads, block_size, 2 * head_size]``
    (CUDA): keys in the first ``head_size`` channels of a token row, values in the rest."""

    def __init__(self, kv_cache: torch.Tensor, kv_cache_dtype: str = "auto"):
        if kv_cache_dtype in QUANTIZED_KV:
            raise NotImplementedError("AdaptiveSpec tree attention needs an unquantized KV cache")
        self.cache = kv_cache
        self.num_blocks, self.num_kv_heads, self.block_size, twice = kv_cache.shape
        self.head_size = twice // 2

    def read_blocks(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.cache[block_ids]  # [..., H, block_size, 2D]
        return rows[..., : self.head_size], rows[..., self.head_size :]

    def read_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.cache[slots // self.block_size, :, slots % self.block_size]  # [n, H, 2D]
        return rows[..., : self.head_size], rows[..., self.head_size :]

    def write_slots(self, layer, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        rows = torch.cat([keys, values], dim=-1).to(self.cache.dtype)
        self.cache[slots // self.block_size, :, slots % self.block_size] = rows
