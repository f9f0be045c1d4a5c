"""Tree attention pieces against brute force: masks, positions, paged-cache access, masked attention
for the target (CPU and CUDA cache layouts, both on CPU tensors) and for the drafter's tree passes."""

from __future__ import annotations

import random

import pytest
import torch

from vllm_adaptivespec.engine.paged_kv import CpuPagedKV, FlashPagedKV, cpu_block_layout
from vllm_adaptivespec.engine.tree_attention import (
    DraftTreeAttention,
    TreeCPUAttentionImpl,
    VerificationPlan,
    attend_with_prefix,
    query_positions,
    query_tree_mask,
)
from vllm_adaptivespec.tree import DraftTrees


def random_trees(seed: int, batch: int = 4, most: int = 12) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    tokens, parents = [], []
    for _ in range(batch):
        n = rng.randint(0, most)
        parents.append([rng.randint(-1, i - 1) for i in range(n)])
        tokens.append([rng.randint(0, 99) for _ in range(n)])
    return tokens, parents


def ancestors(parents: list[int], node: int) -> set[int]:
    seen = set()
    while node >= 0:
        seen.add(node)
        node = parents[node]
    return seen


@pytest.mark.parametrize("seed", range(5))
def test_query_mask_and_positions_match_brute_force(seed):
    tokens, parents = random_trees(seed)
    trees = DraftTrees.from_parents(tokens, parents)
    context = torch.tensor([5, 17, 0, 300])
    mask, positions = query_tree_mask(trees), query_positions(trees, context)
    for b, par in enumerate(parents):
        assert positions[b, 0] == context[b]
        for i in range(len(par)):
            assert positions[b, i + 1] == context[b] + len(ancestors(par, i))
            visible = {0} | {j + 1 for j in ancestors(par, i)}
            assert {k for k in range(mask.shape[2]) if mask[b, i + 1, k]} == visible
        assert mask[b, 0].tolist() == [True] + [False] * (mask.shape[2] - 1)


def brute_attention(q, keys, values, visible, scale):
    """q [H, D]; keys/values [S, Hkv, D]; visible [S] bool -> [H, D], one head at a time."""
    heads, kv_heads = q.shape[0], keys.shape[1]
    out = torch.empty_like(q, dtype=torch.float64)
    for h in range(heads):
        g = h // (heads // kv_heads)
        scores = (keys[visible, g].double() @ q[h].double()) * scale
        out[h] = scores.softmax(0) @ values[visible, g].double()
    return out


def test_attend_with_prefix_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    rows, width, heads, kv_heads, dim, prefix, extra = 2, 3, 4, 2, 8, 6, 5
    q = torch.randn(rows, width, heads, dim, generator=gen)
    pk, pv = torch.randn(rows, kv_heads, prefix, dim, generator=gen), torch.randn(rows, kv_heads, prefix, dim, generator=gen)
    valid = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    ek, ev = torch.randn(rows, extra, kv_heads, dim, generator=gen), torch.randn(rows, extra, kv_heads, dim, generator=gen)
    mask = torch.rand(rows, width, extra, generator=gen) < 0.5
    out = attend_with_prefix(q, pk, pv, valid, ek, ev, mask, 0.3)
    for r in range(rows):
        keys = torch.cat([pk[r].transpose(0, 1), ek[r]])
        values = torch.cat([pv[r].transpose(0, 1), ev[r]])
        for i in range(width):
            visible = torch.cat([valid[r], mask[r, i]])
            expected = brute_attention(q[r, i], keys, values, visible, 0.3)
            torch.testing.assert_close(out[r, i].double(), expected, atol=1e-5, rtol=1e-5)


CPU_LAYOUTS = [("vec", torch.float32, 32, 32), ("vec16", torch.float32, 16, 48), ("vec", torch.bfloat16, 128, 64)]


@pytest.mark.parametrize("isa, dtype, block_size, head_size", CPU_LAYOUTS)
def test_cpu_paged_kv_reads_what_the_kernel_wrote(isa, dtype, block_size, head_size):
    from vllm import _custom_ops as ops

    blocks, kv_heads, n = 5, 2, 40
    cache = torch.zeros(blocks, kv_heads, block_size, 2 * head_size, dtype=dtype)
    key_cache, value_cache = cache.view(blocks, kv_heads, 2 * block_size, head_size).chunk(2, dim=2)
    slots = torch.randperm(blocks * block_size, generator=torch.Generator().manual_seed(1))[:n]
    keys, values = torch.randn(n, kv_heads, head_size).to(dtype), torch.randn(n, kv_heads, head_size).to(dtype)
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, isa)
    paged = CpuPagedKV(cache, isa)
    read_keys, read_values = paged.read_slots(slots)
    assert torch.equal(read_keys, keys) and torch.equal(read_values, values)
    block_keys, _ = paged.read_blocks(torch.arange(blocks))
    assert torch.equal(block_keys.transpose(1, 2).reshape(-1, kv_heads, head_size)[slots], keys)
    paged.write_slots(None, slots[:3].flip(0), keys[:3], values[:3])
    moved_keys, moved_values = paged.read_slots(slots[:3].flip(0))
    assert torch.equal(moved_keys, keys[:3]) and torch.equal(moved_values, values[:3])
    if isa == "vec":  # the documented layout on AVX-512: keys transposed inside a block, values not
        key_at, value_at = cpu_block_layout(isa, dtype, block_size, head_size)
        assert key_at[1, 0] == 1 and key_at[0, 1] == block_size
        assert value_at[0, 1] == block_size * head_size + 1


class _Layer:
    layer_name = "layer.0"
    isa = "vec"
    _k_scale_float = _v_scale_float = 1.0


def _impl(cpu: bool, scale: float):
    """A backend impl with just what the tree path reads (CPU impl: CPU cache layout; other: flash)."""
    impl = object.__new__(TreeCPUAttentionImpl) if cpu else type("FlashLike", (), {})()
    impl.scale, impl.kv_cache_dtype, impl.alibi_slopes, impl.sliding_window = scale, "auto", None, -1
    impl.logits_soft_cap, impl.sinks = 0, None
    return impl


def _filled_cache(cpu: bool, blocks, kv_heads, block_size, head_size, slots, keys, values):
    if cpu:
        cache = torch.zeros(blocks, kv_heads, block_size, 2 * head_size)
        paged = CpuPagedKV(cache, "vec")
    else:
        cache = torch.zeros(blocks, kv_heads, block_size, 2 * head_size)
        paged = FlashPagedKV(cache)
    paged.write_slots(_Layer(), slots, keys, values)
    return cache


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu-cache", "cuda-flash-cache-on-cpu-tensors"])
def test_verification_plan_overwrites_tree_rows_with_masked_attention(cpu):
    """Two tree requests and a plain one in a batch: tree rows see prefix + root path only."""
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, block_size, blocks = 4, 2, 32, 32, 12
    parents = [[-1, -1, 0, 1, 2], [], [-1, 0, -1]]
    trees = DraftTrees.from_parents([[1] * len(p) for p in parents], parents)
    context = torch.tensor([40, 7, 70])
    query_len = [1 + len(p) for p in parents]
    start = [0, query_len[0], query_len[0] + query_len[1]]
    num_tokens = sum(query_len)
    block_table = torch.tensor([[3, 5, 0], [1, 0, 0], [7, 2, 9]])
    seq_len = context + torch.tensor(query_len)
    # Slots of every token (prefix and this step's rows), as vLLM's slot mapping would give them.
    def slot(r, pos):
        return int(block_table[r, pos // block_size]) * block_size + pos % block_size
    all_keys = {r: torch.randn(int(seq_len[r]), kv_heads, dim, generator=gen) for r in range(3)}
    all_values = {r: torch.randn(int(seq_len[r]), kv_heads, dim, generator=gen) for r in range(3)}
    slots = torch.tensor([slot(r, p) for r in range(3) for p in range(int(seq_len[r]))])
    cache = _filled_cache(cpu, blocks, kv_heads, block_size, dim, slots,
                          torch.cat([all_keys[r] for r in range(3)]), torch.cat([all_values[r] for r in range(3)]))  # fmt: skip
    query = torch.randn(num_tokens, heads, dim, generator=gen)
    key = torch.cat([all_keys[r][int(context[r]) :] for r in range(3)])
    value = torch.cat([all_values[r][int(context[r]) :] for r in range(3)])
    output = torch.full((num_tokens, heads, dim), 7.0)
    tree_rows = [0, 2]
    plan = VerificationPlan(
        batch_rows=tree_rows, query_start=[start[r] for r in tree_rows], query_len=[query_len[r] for r in tree_rows],
        context_len=context[tree_rows], mask=query_tree_mask(trees)[tree_rows], num_tokens=num_tokens, device="cpu",
    )  # fmt: skip
    metadata = type("Metadata", (), {"num_actual_tokens": num_tokens, "block_table": block_table})()
    plan.attend(_impl(cpu, 0.2), _Layer(), query, key, value, cache, metadata, output)
    assert plan.used
    assert torch.equal(output[start[1]], torch.full((heads, dim), 7.0))  # the plain request is untouched
    for r in tree_rows:
        ctx = int(context[r])
        for i in range(query_len[r]):
            visible = torch.zeros(int(seq_len[r]), dtype=torch.bool)
            visible[:ctx + 1] = True  # prefix and root
            if i > 0:
                for j in ancestors(parents[r], i - 1):
                    visible[ctx + 1 + j] = True
            expected = brute_attention(query[start[r] + i], all_keys[r], all_values[r], visible, 0.2)
            torch.testing.assert_close(output[start[r] + i].double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu-cache", "cuda-flash-cache-on-cpu-tensors"])
def test_draft_tree_attention_sees_prefix_and_root_path_over_passes(cpu):
    """Three drafter passes over two requests: each tree token sees the prefix and its own root path."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, block_size, blocks = 2, 1, 32, 32, 6
    prefix_len = torch.tensor([10, 33])
    block_table = torch.tensor([[4, 0], [1, 2]])
    prefix_keys = {b: torch.randn(int(prefix_len[b]), kv_heads, dim, generator=gen) for b in range(2)}
    prefix_values = {b: torch.randn(int(prefix_len[b]), kv_heads, dim, generator=gen) for b in range(2)}
    slots = torch.tensor([int(block_table[b, p // block_size]) * block_size + p % block_size
                          for b in range(2) for p in range(int(prefix_len[b]))])  # fmt: skip
    cache = _filled_cache(cpu, blocks, kv_heads, block_size, dim, slots,
                          torch.cat([prefix_keys[0], prefix_keys[1]]), torch.cat([prefix_values[0], prefix_values[1]]))  # fmt: skip
    plan = DraftTreeAttention(block_table, prefix_len, max_tree_tokens=6)
    # (request, parent slot) per row and pass; slots are handed out per request in row order.
    passes = [([0, 0, 1], [-1, -1, -1]), ([0, 0, 1, 1], [0, 1, 0, 0]), ([0, 1], [3, 2])]
    parent_of: dict[tuple[int, int], int] = {}
    tree_keys: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for requests, parents in passes:
        request, parent = torch.tensor(requests), torch.tensor(parents)
        slot = plan.begin_pass(request, parent)
        n = len(requests)
        query, key, value = (torch.randn(n, h, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
        output = torch.zeros(n, heads, dim)
        plan.attend(_impl(cpu, 0.5), _Layer(), query, key, value, cache, output)
        for i in range(n):
            b, s = requests[i], int(slot[i])
            parent_of[b, s] = parents[i]
            tree_keys[b, s] = (key[i], value[i])
            path, node = [], s
            while node >= 0:
                path.append(node)
                node = parent_of[b, node]
            keys = torch.cat([prefix_keys[b]] + [tree_keys[b, p][0][None] for p in reversed(path)])
            values = torch.cat([prefix_values[b]] + [tree_keys[b, p][1][None] for p in reversed(path)])
            expected = brute_attention(query[i], keys, values, torch.ones(keys.shape[0], dtype=torch.bool), 0.5)
            torch.testing.assert_close(output[i].double(), expected, atol=1e-5, rtol=1e-5)
