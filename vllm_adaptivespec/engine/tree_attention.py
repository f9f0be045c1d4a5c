"""Ancestor-mask attention for draft trees, shared by the target (verification) and the drafter.

vLLM's attention kernels know causal masks only. A flattened draft tree is scheduled like a chain,
so rows must instead see the request's cached prefix plus their own root path. Each row is computed
once per layer, by one of two paths:

* Target: ``VerificationPlan`` names the batch rows of one target forward whose query block
  ``[root, node 0, ..., node N-1]`` is a real tree; the root and each node see the prefix, the root,
  and the node's ancestors (``query_tree_mask``); positions are ``context + depth``
  (``query_positions``). A block's *chain rows* are the root and its leading nodes whose ancestors
  are exactly the nodes before them (the tree layout puts the top-1 chain first): the causal
  kernel is exact for them. Its *branch rows* are the other nodes. The stock kernel runs on the
  *stock rows* only, every row of the forward but the branch rows (plain requests' rows and chain
  rows), under metadata with each tree request's query cut to its chain rows
  (``TreeRowsAttention.stock_rows_metadata``); the branch rows are then computed by one masked SDPA
  over the prefix (gathered from the paged cache, ``paged_kv``) and their block. Chains need no plan.
  The runner builds the plan and hands it to the attention layers on that forward's attention
  metadata (``attach_verification_plan``), never through module state.
* Drafter: ``DraftTreeAttention`` is passed as the attention metadata of the drafter's tree passes.
  Those passes write nothing to the paged cache: each pass's keys/values are kept beside it, so the
  frontier nodes of every level see the prefix plus the nodes on their own root path. Only the
  requests still growing a tree take part (prefix gathered and attention computed for them alone).

The mask and position builders are plain tensor code (CPU or CUDA); the backends that use them are
``TreeCPUAttentionBackend`` here and ``tree_attention_cuda.TreeFlashAttentionBackend``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
import torch.nn.functional as F
from vllm import _custom_ops as ops
from vllm import envs
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


def masked_attention(
    query: torch.Tensor,  # [R, Q, num_heads, head_size]
    keys: torch.Tensor,  # [R, num_kv_heads, S, head_size] float32
    values: torch.Tensor,  # [R, num_kv_heads, S, head_size] float32
    visible: torch.Tensor,  # [R, Q, S] bool: query q may attend to key s
    scale: float,
) -> torch.Tensor:
    """SDPA of ``query`` [R, Q, H, D] over keys/values [R, Hkv, S, D] under ``visible`` [R, Q, S];
    returns [R, Q, H, D] (float32). Every query row must see at least one key."""
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2).float(), keys, values, attn_mask=visible[:, None], scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)


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
    visible = torch.cat([prefix_valid[:, None, :].expand(rows, width, -1), mask], dim=2)
    return masked_attention(query, all_keys, all_values, visible, scale)


def chain_rows(parents: Sequence[int]) -> int:
    """The chain rows of a query block whose nodes have ``parents``: the root plus the leading nodes
    whose ancestors are exactly the nodes before them (``parents[i] == i - 1``)."""
    count = 0
    while count < len(parents) and parents[count] == count - 1:
        count += 1
    return 1 + count


class VerificationPlan:
    """The tree rows of one target forward: which batch rows hold trees, where each one's query block
    starts, how many of its rows are chain rows, how many cached tokens precede it, and the mask over
    the block (terms: the module docstring).

    The stock kernel computes ``stock_rows`` [T'] (under ``stock_metadata``), the masked path
    ``branch_rows`` [R, M] (those marked ``branch_real``; ``attend``): together every query row of the
    forward, each once."""

    def __init__(
        self,
        batch_rows,  # [R]: the batch rows that hold real trees
        query_start,  # [R]: each one's first query row in the forward (its root)
        query_len,  # [R]: 1 + its nodes
        chain_len,  # [R]: its chain rows (``chain_rows``), fewer than query_len
        context_len,  # [R]: cached tokens before its query block
        mask: torch.Tensor,  # [R, Q, Q] bool, Q = 1 + the most nodes: ``query_tree_mask`` of those rows
        num_tokens: int,  # query rows of the whole forward
        device,
    ):
        self.batch_rows = torch.as_tensor(batch_rows, dtype=torch.long, device=device)
        self.context_len = torch.as_tensor(context_len, dtype=torch.long, device=device)
        self.query_len = torch.as_tensor(query_len, dtype=torch.long, device=device)
        self.num_tokens = num_tokens
        start = torch.as_tensor(query_start, dtype=torch.long, device=device)
        chain = torch.as_tensor(chain_len, dtype=torch.long, device=device)
        self.branch_count = self.query_len - chain  # [R] branch rows per block
        counts = self.branch_count.tolist()
        if not counts or min(counts) < 1:
            raise ValueError("every block of a verification plan needs a branch row (chains need no plan)")
        mask = mask.to(device)
        rows, width = mask.shape[0], max(counts)
        step = torch.arange(width, device=device)
        self.branch_real = step[None, :] < self.branch_count[:, None]  # [R, M]
        # Block row of each branch slot; padding slots repeat the block's last row (computed, not written).
        in_block = torch.minimum(chain[:, None] + step, self.query_len[:, None] - 1)  # [R, M]
        self.branch_rows = start[:, None] + in_block  # [R, M] forward rows
        self.branch_mask = mask.gather(1, in_block[:, :, None].expand(rows, width, mask.shape[2]))  # [R, M, Q]
        self._written = self.branch_rows[self.branch_real]  # [branch rows] forward rows
        self._written_at = self.branch_real.reshape(-1).nonzero()[:, 0]  # [branch rows] in [R * M]
        branch = torch.zeros(num_tokens, dtype=torch.bool, device=device)
        branch[self._written] = True
        self.stock_rows = (~branch).nonzero()[:, 0]  # [T']
        self._stock: dict[tuple, tuple] = {}  # per metadata object (and head layout): its stock-rows metadata
        self._visible: dict[int, torch.Tensor] = {}  # per gathered key width: [R, M, S] bool
        self.used = False  # set by the first layer that applies it (a backend that ignores it is a bug)

    def _check(self, metadata) -> None:
        if metadata.num_actual_tokens != self.num_tokens:
            raise RuntimeError(
                f"tree plan for {self.num_tokens} tokens met a forward of {metadata.num_actual_tokens}"
            )

    def stock_metadata(self, impl, layer, metadata, dtype: torch.dtype):
        """``metadata`` for the stock rows only: each tree request's query cut to its chain rows
        (``query_start_loc`` [B + 1] and ``seq_lens`` [B] less the branch rows before / of each request),
        made by the backend (``impl.stock_rows_metadata``) once per metadata object and head layout."""
        self._check(metadata)
        key = (id(metadata), impl.num_heads, impl.num_kv_heads, impl.head_size, getattr(layer, "isa", None), dtype)
        made = self._stock.get(key)
        if made is None:
            seq_lens, query_start_loc = metadata.seq_lens, metadata.query_start_loc
            if query_start_loc.shape[0] != seq_lens.shape[0] + 1:
                raise RuntimeError("tree plan: query_start_loc and seq_lens disagree on the batch size")
            dropped = torch.zeros_like(seq_lens)  # [B] branch rows of each request
            dropped[self.batch_rows.to(seq_lens.device)] = self.branch_count.to(seq_lens)
            before = torch.zeros_like(query_start_loc)  # [B + 1] branch rows of the requests before
            before[1:] = torch.cumsum(dropped, 0)
            stock = impl.stock_rows_metadata(
                layer, metadata, query_start_loc - before, seq_lens - dropped, int(self.stock_rows.shape[0]), dtype
            )
            made = self._stock[key] = (metadata, stock)  # the metadata is held so its id stays unique
        return made[1]

    def attend(
        self,
        impl,
        layer,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        kv_cache: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, 2 * head_size], this step's rows written
        metadata,  # the layer's attention metadata (num_actual_tokens, block_table [batch, max_blocks])
        output: torch.Tensor,  # [num_tokens, num_heads, head_size]: the branch rows are written
    ) -> None:
        """Write the branch rows of ``output``: ancestor-masked attention over the prefix and the block,
        both read from the paged cache (vLLM wrote this step's rows by row, at positions context + row)."""
        self._check(metadata)
        self.used = True
        cache = paged_kv(impl, layer, kv_cache)
        block_table = metadata.block_table.index_select(0, self.batch_rows)
        keys, values, _ = gather_prefix(cache, block_table, self.context_len + self.query_len)
        span = keys.shape[2]
        visible = self._visible.get(span)
        if visible is None:  # the same for every layer of the forward: the prefix, then the block's mask
            rows, width, block = self.branch_mask.shape
            device = self.branch_mask.device
            visible = torch.arange(span + block, device=device) < self.context_len[:, None, None]
            visible = visible.expand(rows, width, span + block).clone()  # [R, M, S + Q]
            column = (self.context_len[:, None] + torch.arange(block, device=device))[:, None, :]
            visible.scatter_(2, column.expand(rows, width, block), self.branch_mask)
            visible = self._visible[span] = visible[:, :, :span]
        rows, width = self.branch_rows.shape
        grid = query.index_select(0, self.branch_rows.reshape(-1)).view(rows, width, *query.shape[1:])
        out = masked_attention(grid, keys.float(), values.float(), visible, impl.scale)  # [R, M, H, D]
        out = out.reshape(rows * width, *out.shape[2:]).index_select(0, self._written_at)
        output.index_copy_(0, self._written, out.to(output.dtype))


class DraftTreeAttention:
    """Attention metadata of the drafter's tree passes (one object per propose call).

    Terms: a request is *growing* when its tree has two levels or more (``depths[b] >= 2``): only
    growing requests have rows in the passes after the first, so only they get attention work here.
    They are held deepest first (``growing``; ``g`` is a request's index there), so the requests of a
    pass (those whose trees are deeper than the levels built so far) are a leading run ``[:active]``
    of them, and each pass works on that run alone.

    Per layer, each growing request's prefix (``prefix_len`` tokens, the root included) is read from
    the drafter's paged cache once, into a float32 key/value buffer whose last ``capacity`` columns
    are side slots: the tree tokens of each pass get slots there, and ``visible[g, s]`` says which
    earlier slots slot s may attend to (its root path)."""

    def __init__(
        self,
        block_table: torch.Tensor,  # [B, max_blocks]: each request's drafter cache blocks
        prefix_len: torch.Tensor,  # [B] long: cached tokens per request, the root included
        depths: Sequence[int],  # [B]: levels of each request's tree
        max_tree_tokens: int,
    ):
        device = prefix_len.device
        order = sorted((b for b, depth in enumerate(depths) if depth >= 2), key=lambda b: -depths[b])
        self.growing = torch.tensor(order, dtype=torch.long, device=device)  # [G] batch rows, deepest first
        self._index = torch.full((len(depths),), -1, dtype=torch.long, device=device)  # [B] -> g (-1: not growing)
        self._index[self.growing] = torch.arange(len(order), device=device)
        self.block_table = block_table[self.growing]  # [G, max_blocks]
        self.prefix_len = prefix_len.long()[self.growing]  # [G]
        self.capacity = max(1, max_tree_tokens)
        self.visible = torch.zeros(len(order), self.capacity, self.capacity, dtype=torch.bool, device=device)
        self.count = torch.zeros(len(order), dtype=torch.long, device=device)  # [G] slots handed out
        # Per layer: keys, values [G, kv_heads, P + capacity, head_size] float32 and prefix valid [G, P].
        self._kv: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._g = self._slot = self._column = None
        self._width = self.active = 0

    def begin_pass(
        self,
        request: torch.Tensor,  # [rows] long: each row's batch row, grouped and in order
        parent_slot: torch.Tensor,  # [rows] long: the slot of the node the row extends (-1: the root)
    ) -> torch.Tensor:
        """Rows of the next pass: row i belongs to batch row ``request[i]`` (a growing request; grouped,
        in order) and extends the node in ``parent_slot[i]`` (-1: the root). Returns each row's slot
        (numbered per request)."""
        rows = request.shape[0]
        g = self._index[request]  # [rows]
        growing = self.count.shape[0]
        per_request = torch.bincount(g.clamp(min=0), minlength=growing)
        row = torch.arange(rows, device=request.device)
        # Each request's first row (its rows are one run, but runs are in batch order, not deepest first).
        first = torch.full((growing,), rows, dtype=torch.long, device=request.device)
        first = first.scatter_reduce(0, g.clamp(min=0), row, reduce="amin")
        column = row - first[g]
        slot = self.count[g] + column
        lowest, highest_slot, width, last = (
            torch.stack([g.min(), slot.max(), per_request.max(), g.max()]).tolist() if rows else (0, -1, 0, -1)
        )
        if lowest < 0:
            raise RuntimeError("a drafter tree pass has a row of a request that grows no tree")
        if highest_slot >= self.capacity:
            raise RuntimeError("drafter tree outgrew its attention buffer")
        parent_rows = torch.where((parent_slot >= 0)[:, None], self.visible[g, parent_slot.clamp(min=0)], False)
        parent_rows[row, slot] = True
        self.visible[g, slot] = parent_rows
        self.count += per_request
        self._g, self._slot, self._column = g, slot, column
        self._width, self.active = width, last + 1
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
        """Attention of the current pass's rows over their prefix and their root path's earlier slots,
        for the pass's requests (``[:active]`` of the growing ones) only."""
        rows, active = self._g.shape[0], self.active
        if rows == 0:
            return output
        name = layer.layer_name
        if name not in self._kv:
            prefix_keys, prefix_values, valid = gather_prefix(
                paged_kv(impl, layer, kv_cache), self.block_table, self.prefix_len
            )  # [G, Hkv, P, D] x2, [G, P]
            growing, kv_heads, span, _ = prefix_keys.shape
            width = span + self.capacity
            keys = prefix_keys.new_zeros(growing, kv_heads, width, prefix_keys.shape[3], dtype=torch.float32)
            values = prefix_values.new_zeros(growing, kv_heads, width, prefix_values.shape[3], dtype=torch.float32)
            keys[:, :, :span], values[:, :, :span] = prefix_keys, prefix_values
            self._kv[name] = (keys, values, valid)
        keys, values, valid = self._kv[name]
        span = valid.shape[1]
        keys[self._g, :, span + self._slot] = key[:rows].float()
        values[self._g, :, span + self._slot] = value[:rows].float()
        grid = query.new_zeros(active, self._width, *query.shape[1:])  # [active, width, H, D]
        grid[self._g, self._column] = query[:rows]
        visible = torch.zeros(active, self._width, span + self.capacity, dtype=torch.bool, device=query.device)
        visible[:, :, :span] = valid[:active, None, :]
        visible[self._g, self._column, span:] = self.visible[self._g, self._slot]
        out = masked_attention(grid, keys[:active], values[:active], visible, impl.scale)
        output[:rows] = out[self._g, self._column].to(output.dtype)
        return output


class TreeRowsAttention:
    """Mixed in before one of vLLM's attention impls: with a verification plan, its kernel for the stock
    rows and ancestor-masked attention for the branch rows (stock when the metadata carries no tree);
    the drafter's tree passes (``DraftTreeAttention``) entirely masked."""

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
        plan = verification_plan(attn_metadata)
        if plan is None:
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )
        rows = plan.stock_rows  # (index_select / index_copy_: on CPU far cheaper than x[rows] for few rows)
        stock = plan.stock_metadata(self, layer, attn_metadata, query.dtype)
        stock_output = output.new_empty((rows.shape[0], *output.shape[1:]))  # [T', num_heads, head_size]
        super().forward(
            layer, query.index_select(0, rows), None if key is None else key.index_select(0, rows),
            None if value is None else value.index_select(0, rows), kv_cache, stock, stock_output,
            output_scale, output_block_scale,
        )  # fmt: skip
        output.index_copy_(0, rows, stock_output)
        plan.attend(self, layer, query, kv_cache, attn_metadata, output)
        return output

    def stock_rows_metadata(
        self,
        layer,
        metadata,  # the forward's metadata of this backend
        query_start_loc: torch.Tensor,  # [B + 1]: the stock rows' query starts
        seq_lens: torch.Tensor,  # [B]: each request's tokens up to its last stock row
        num_tokens: int,  # stock rows in all
        dtype: torch.dtype,  # the query's
    ):
        """``metadata`` with the shorter queries of the stock rows (each backend says what else changes)."""
        raise NotImplementedError(f"{type(self).__name__} has no stock-rows metadata for draft trees")


class TreeCPUAttentionImpl(TreeRowsAttention, CPUAttentionBackendImpl):
    """vLLM's CPU attention for the stock rows, ancestor-masked attention for draft-tree branch rows."""

    def stock_rows_metadata(self, layer, metadata, query_start_loc, seq_lens, num_tokens, dtype):
        """CPU: the kernel's work split (scheduler metadata) rebuilt for the shorter queries, as
        ``CPUAttentionMetadataBuilder.build`` makes it."""
        scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=seq_lens.shape[0], num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_size, seq_lens=seq_lens, dtype=dtype, query_start_loc=query_start_loc,
            causal=metadata.causal, sliding_window_size=self.sliding_window, isa=layer.isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV, dynamic_causal=metadata.dynamic_causal,
            kv_cache_dtype=self.kv_cache_dtype,
        )  # fmt: skip
        return dataclasses.replace(
            metadata, num_actual_tokens=num_tokens, query_start_loc=query_start_loc, seq_lens=seq_lens,
            scheduler_metadata=scheduler_metadata,
        )  # fmt: skip


class TreeCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeCPUAttentionImpl]:
        return TreeCPUAttentionImpl
