"""Ancestor-mask attention for draft trees, shared by the target (verification) and the drafter.

vLLM's attention kernels know causal masks only. A flattened draft tree is scheduled like a chain,
so rows must instead see the request's cached prefix plus their own root path. For the rows of a
tree we therefore gather the prefix keys/values from the paged cache (``paged_kv``) and run one
masked SDPA; every other row keeps the stock kernel's result.

* Target: ``VerificationPlan`` names the batch rows of one target forward whose query block
  ``[root, node 0, ..., node N-1]`` is a real tree; the root and each node see the prefix, the root,
  and the node's ancestors (``query_tree_mask``); positions are ``context + depth``
  (``query_positions``). Chains need neither: the causal kernel is exact. The runner builds the plan
  and hands it to the attention layers on that forward's attention metadata
  (``attach_verification_plan``), never through module state.
* Drafter: ``DraftTreeAttention`` is passed as the attention metadata of the drafter's tree passes.
  Those passes write nothing to the paged cache: each pass's keys/values are kept beside it, so the
  frontier nodes of every level see the prefix plus the nodes on their own root path.

The mask and position builders are plain tensor code (CPU or CUDA); the backends that use them are
``TreeCPUAttentionBackend`` here and ``tree_attention_cuda.TreeFlashAttentionBackend``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from vllm_adaptivespec.engine.paged_kv import CpuPagedKV, FlashPagedKV
from vllm_adaptivespec.tree import DraftTrees

# The attribute of a target forward's per-layer attention metadata that carries its VerificationPlan.
_PLAN = "adaptivespec_verification_plan"


def attach_verification_plan(attn_metadata, plan: VerificationPlan) -> None:
    """Give every layer of the target forward ``plan``: ``attn_metadata`` is the runner's per-layer
    metadata of that forward (``{layer name: metadata}``, objects shared by the layers of a group)."""
    if not isinstance(attn_metadata, dict):
        raise NotImplementedError("AdaptiveSpec trees do not support micro-batched forwards")
    for metadata in attn_metadata.values():
        setattr(metadata, _PLAN, plan)


def verification_plan(attn_metadata) -> VerificationPlan | None:
    """The tree rows of the forward ``attn_metadata`` belongs to (None: no tree, or no metadata)."""
    return getattr(attn_metadata, _PLAN, None)


def query_tree_mask(trees: DraftTrees) -> torch.Tensor:
    """[B, 1+N, 1+N] bool: query row i (0 = root, j+1 = node j) may attend to query row k.

    The root sees itself; node j sees the root, its ancestors and itself (core's ancestor mask).
    Padding nodes see the root and themselves, so no row is empty."""
    batch, slots = trees.tokens.shape
    mask = torch.zeros(batch, slots + 1, slots + 1, dtype=torch.bool, device=trees.device)
    mask[:, :, 0] = True
    mask[:, 1:, 1:] = trees.ancestor_mask()
    return mask


def query_positions(
    trees: DraftTrees,  # B trees of at most N nodes
    context_len: torch.Tensor,  # [B] long: cached tokens before each query block
) -> torch.Tensor:
    """[B, 1+N] positions of the query block: the root at ``context_len``, node j at context + depth."""
    root = context_len.to(trees.device).long()[:, None]
    return torch.cat([root, trees.positions(context_len.long())], dim=1)


def paged_kv(
    impl,
    layer,
    # [num_blocks, num_kv_heads, block_size, 2 * head_size] (CPU_ATTN and FLASH_ATTN alike)
    kv_cache: torch.Tensor,
):
    """Token-row access to the cache of ``layer`` (the impl tells which backend layout it uses)."""
    check_supported(impl)
    if isinstance(impl, CPUAttentionBackendImpl):
        return CpuPagedKV(kv_cache, layer.isa, impl.kv_cache_dtype)
    return FlashPagedKV(kv_cache, impl.kv_cache_dtype)


def check_supported(impl) -> None:
    unsupported = [
        name
        for name, present in (
            ("ALiBi", getattr(impl, "alibi_slopes", None) is not None),
            ("sliding window", getattr(impl, "sliding_window", None) not in (None, -1, (-1, -1))),
            ("logit softcap", bool(getattr(impl, "logits_soft_cap", 0) or 0)),
            ("attention sinks", getattr(impl, "sinks", None) is not None),
        )
        if present
    ]
    if unsupported:
        raise NotImplementedError(f"AdaptiveSpec tree attention does not support {', '.join(unsupported)}")


def gather_prefix(
    cache,  # CpuPagedKV or FlashPagedKV
    block_table: torch.Tensor,  # [R, max_blocks]: each request's cache blocks
    prefix_len: torch.Tensor,  # [R] long: tokens to read per request
):
    """Cached keys/values of each request's first ``prefix_len`` tokens.

    ``block_table`` [R, max_blocks] -> keys, values [R, kv_heads, P, D] and valid [R, P] bool."""
    rows = block_table.shape[0]
    longest = int(prefix_len.max()) if rows else 0
    num_blocks = max(1, -(-longest // cache.block_size))
    keys, values = cache.read_blocks(block_table[:, :num_blocks].long().clamp(min=0))  # [R, nb, H, bs, D]
    keys = keys.permute(0, 2, 1, 3, 4).reshape(rows, cache.num_kv_heads, num_blocks * cache.block_size, -1)
    values = values.permute(0, 2, 1, 3, 4).reshape(rows, cache.num_kv_heads, num_blocks * cache.block_size, -1)
    valid = torch.arange(num_blocks * cache.block_size, device=block_table.device) < prefix_len[:, None]
    return keys, values, valid


def attend_with_prefix(
    query: torch.Tensor,  # [R, Q, num_heads, head_size]
    prefix_keys: torch.Tensor,  # [R, num_kv_heads, P, head_size]
    prefix_values: torch.Tensor,  # [R, num_kv_heads, P, head_size]
    prefix_valid: torch.Tensor,  # [R, P] bool
    keys: torch.Tensor,  # [R, E, num_kv_heads, head_size]
    values: torch.Tensor,  # [R, E, num_kv_heads, head_size]
    mask: torch.Tensor,  # [R, Q, E] bool: query q may attend to key e
    scale: float,
) -> torch.Tensor:
    """SDPA of ``query`` [R, Q, H, D] over a visible prefix ([R, Hkv, P, D] + valid [R, P]) and
    further keys/values [R, E, Hkv, D] under ``mask`` [R, Q, E]; returns [R, Q, H, D] (float32)."""
    rows, width = query.shape[:2]
    all_keys = torch.cat([prefix_keys.float(), keys.transpose(1, 2).float()], dim=2)
    all_values = torch.cat([prefix_values.float(), values.transpose(1, 2).float()], dim=2)
    visible = torch.cat([prefix_valid[:, None, :].expand(rows, width, -1), mask], dim=2)[:, None]
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2).float(), all_keys, all_values, attn_mask=visible, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)


class VerificationPlan:
    """The tree rows of one target forward: which batch rows, where their query block starts,
    how many cached tokens precede it, and the mask over the block."""

    def __init__(
        self,
        batch_rows,  # [R]: the batch rows that hold real trees
        query_start,  # [R]: each one's first query row in the forward (its root)
        query_len,  # [R]: 1 + its nodes
        context_len,  # [R]: cached tokens before its query block
        mask: torch.Tensor,  # [R, Q, Q] bool, Q = 1 + the most nodes: ``query_tree_mask`` of those rows
        num_tokens: int,  # query rows of the whole forward
        device,
    ):
        self.batch_rows = torch.as_tensor(batch_rows, dtype=torch.long, device=device)
        self.context_len = torch.as_tensor(context_len, dtype=torch.long, device=device)
        self.mask = mask.to(device)  # [R, Q, Q]
        self.num_tokens = num_tokens
        width = self.mask.shape[1]
        start = torch.as_tensor(query_start, dtype=torch.long, device=device)
        length = torch.as_tensor(query_len, dtype=torch.long, device=device)
        self.rows = (start[:, None] + torch.arange(width, device=device)).clamp(max=max(num_tokens - 1, 0))
        self.real = torch.arange(width, device=device)[None, :] < length[:, None]
        self.used = False  # set by the first layer that applies it (a backend that ignores it is a bug)

    def attend(
        self,
        impl,
        layer,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, 2 * head_size], this step's rows written
        metadata,  # the layer's attention metadata (num_actual_tokens, block_table [batch, max_blocks])
        output: torch.Tensor,  # [num_tokens, num_heads, head_size]: the stock kernel's result, tree rows overwritten
    ) -> None:
        """Overwrite the tree rows of ``output`` with ancestor-masked attention."""
        if metadata.num_actual_tokens != self.num_tokens:
            raise RuntimeError(
                f"tree plan for {self.num_tokens} tokens met a forward of {metadata.num_actual_tokens}"
            )
        self.used = True
        cache = paged_kv(impl, layer, kv_cache)
        prefix = gather_prefix(cache, metadata.block_table[self.batch_rows], self.context_len)
        out = attend_with_prefix(
            query[self.rows], *prefix, key[self.rows], value[self.rows], self.mask, impl.scale
        )
        output[self.rows[self.real]] = out[self.real].to(output.dtype)


class DraftTreeAttention:
    """Attention metadata of the drafter's tree passes (one object per propose call).

    Every request's prefix (``prefix_len`` tokens, the root included) is read from the drafter's
    paged cache once per layer; the tree tokens of each pass get slots in a side buffer per layer,
    and ``visible[b, s]`` says which earlier slots slot s may attend to (its root path)."""

    def __init__(
        self,
        block_table: torch.Tensor,  # [B, max_blocks]: each request's drafter cache blocks
        prefix_len: torch.Tensor,  # [B] long: cached tokens per request, the root included
        max_tree_tokens: int,
    ):
        self.block_table = block_table
        self.prefix_len = prefix_len.long()
        device = prefix_len.device
        batch = prefix_len.shape[0]
        self.capacity = max(1, max_tree_tokens)
        self.visible = torch.zeros(batch, self.capacity, self.capacity, dtype=torch.bool, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)
        self._prefix: dict[str, tuple] = {}
        self._side: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._request = self._slot = self._column = None
        self._width = 0

    def begin_pass(
        self,
        request: torch.Tensor,  # [rows] long: each row's request, grouped and in order
        parent_slot: torch.Tensor,  # [rows] long: the slot of the node the row extends (-1: the root)
    ) -> torch.Tensor:
        """Rows of the next pass: row i belongs to ``request[i]`` (grouped, in order) and extends the
        node in ``parent_slot[i]`` (-1: the root). Returns each row's slot."""
        batch = self.count.shape[0]
        per_request = torch.bincount(request, minlength=batch)
        first = torch.cumsum(per_request, 0) - per_request
        column = torch.arange(request.shape[0], device=request.device) - first[request]
        slot = self.count[request] + column
        if bool((slot >= self.capacity).any()):
            raise RuntimeError("drafter tree outgrew its attention buffer")
        parent_rows = torch.where(
            (parent_slot >= 0)[:, None], self.visible[request, parent_slot.clamp(min=0)], False
        )
        parent_rows[torch.arange(request.shape[0], device=request.device), slot] = True
        self.visible[request, slot] = parent_rows
        self.count += per_request
        self._request, self._slot, self._column = request, slot, column
        self._width = int(per_request.max()) if request.numel() else 0
        return slot

    def attend(
        self,
        impl,
        layer,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]: the pass's rows first, then padding
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, 2 * head_size] (read only)
        output: torch.Tensor,  # [num_tokens, num_heads, head_size]: the pass's rows written
    ) -> torch.Tensor:
        """Attention of the current pass's rows over their prefix and their root path's earlier slots."""
        name = layer.layer_name
        if name not in self._prefix:
            cache = paged_kv(impl, layer, kv_cache)
            self._prefix[name] = gather_prefix(cache, self.block_table, self.prefix_len)
        if name not in self._side:
            shape = (self.count.shape[0], self.capacity, key.shape[1], key.shape[2])
            self._side[name] = (
                torch.zeros(shape, dtype=torch.float32, device=key.device),
                torch.zeros(shape[:3] + (value.shape[2],), dtype=torch.float32, device=key.device),
            )
        side_keys, side_values = self._side[name]
        rows = self._request.shape[0]
        side_keys[self._request, self._slot] = key[:rows].float()
        side_values[self._request, self._slot] = value[:rows].float()
        batch = self.count.shape[0]
        grid = torch.zeros(batch, self._width, *query.shape[1:], dtype=query.dtype, device=query.device)
        grid[self._request, self._column] = query[:rows]
        mask = torch.zeros(batch, self._width, self.capacity, dtype=torch.bool, device=query.device)
        mask[self._request, self._column] = self.visible[self._request, self._slot]
        out = attend_with_prefix(grid, *self._prefix[name], side_keys, side_values, mask, impl.scale)
        output[:rows] = out[self._request, self._column].to(output.dtype)
        return output


class TreeRowsAttention:
    """Mixed in before one of vLLM's attention impls: its result for every row, then ancestor-masked rows
    for draft trees (stock when the metadata carries no tree)."""

    def forward(
        self,
        layer,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, 2 * head_size]
        attn_metadata,  # the backend's metadata (with a VerificationPlan: tree rows), DraftTreeAttention, or None
        output: torch.Tensor,  # [num_tokens, num_heads, head_size]
        output_scale=None,
        output_block_scale=None,
    ):
        if isinstance(attn_metadata, DraftTreeAttention):
            return attn_metadata.attend(self, layer, query, key, value, kv_cache, output)
        output = super().forward(
            layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
        )
        plan = verification_plan(attn_metadata)
        if plan is not None:
            plan.attend(self, layer, query, key, value, kv_cache, attn_metadata, output)
        return output


class TreeCPUAttentionImpl(TreeRowsAttention, CPUAttentionBackendImpl):
    """vLLM's CPU attention, plus ancestor-masked rows for draft trees."""


class TreeCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeCPUAttentionImpl]:
        return TreeCPUAttentionImpl
