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


def _cpu_impl(heads: int, kv_heads: int, dim: int, scale: float) -> TreeCPUAttentionImpl:
    """The CPU tree impl with what vLLM's own ``CPUAttentionBackendImpl.forward`` reads (no vLLM config)."""
    from vllm.v1.attention.backend import AttentionType

    impl = _impl(True, scale)
    impl.num_heads, impl.num_kv_heads, impl.head_size = heads, kv_heads, dim
    impl.attn_type, impl.use_zentorch_sdpa = AttentionType.DECODER, False
    return impl


# A batch of two tree requests around a plain one (its 2 rows: a chain draft). Request 0's chain rows are
# the root and nodes 0-2 (node 3 hangs off the root, so the chain stops there); request 2's are the root
# and node 0.
PARENTS = [[-1, 0, 1, -1, 3, 0], [-1], [-1, -1, 0]]
TREE_ROWS = [0, 2]


def _verification_batch(cpu: bool, seed: int = 2):
    """Cache, query and metadata of one target forward over ``PARENTS``, and its verification plan."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

    from vllm_adaptivespec.engine.tree_attention import chain_rows

    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim, block_size, blocks = 4, 2, 32, 32, 12
    trees = DraftTrees.from_parents([[1] * len(p) for p in PARENTS], PARENTS)
    context = torch.tensor([40, 7, 70])
    query_len = [1 + len(p) for p in PARENTS]
    start = [0, query_len[0], query_len[0] + query_len[1]]
    num_tokens = sum(query_len)
    block_table = torch.tensor([[3, 5, 0], [1, 0, 0], [7, 2, 9]], dtype=torch.int32)
    seq_len = context + torch.tensor(query_len)

    def slot(r, pos):  # vLLM's slot mapping: this step's rows by row, after the prefix
        return int(block_table[r, pos // block_size]) * block_size + pos % block_size

    all_keys = {r: torch.randn(int(seq_len[r]), kv_heads, dim, generator=gen) for r in range(3)}
    all_values = {r: torch.randn(int(seq_len[r]), kv_heads, dim, generator=gen) for r in range(3)}
    slots = torch.tensor([slot(r, p) for r in range(3) for p in range(int(seq_len[r]))])
    cache = _filled_cache(cpu, blocks, kv_heads, block_size, dim, slots,
                          torch.cat([all_keys[r] for r in range(3)]), torch.cat([all_values[r] for r in range(3)]))  # fmt: skip
    query = torch.randn(num_tokens, heads, dim, generator=gen)
    key = torch.cat([all_keys[r][int(context[r]) :] for r in range(3)])
    value = torch.cat([all_values[r][int(context[r]) :] for r in range(3)])
    query_start_loc = torch.tensor([0, *[start[1], start[2]], num_tokens], dtype=torch.int32)
    seq_lens = seq_len.to(torch.int32)
    metadata = CPUAttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=max(query_len), query_start_loc=query_start_loc,
        max_seq_len=int(seq_lens.max()), seq_lens=seq_lens, block_table=block_table, slot_mapping=slots,
        scheduler_metadata=ops.cpu_attn_get_scheduler_metadata(
            num_reqs=3, num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, seq_lens=seq_lens,
            dtype=torch.float32, query_start_loc=query_start_loc, causal=True, sliding_window_size=-1,
            isa="vec", enable_kv_split=False,
        ),
    )  # fmt: skip
    plan = VerificationPlan(
        batch_rows=TREE_ROWS, query_start=[start[r] for r in TREE_ROWS], query_len=[query_len[r] for r in TREE_ROWS],
        chain_len=[chain_rows(PARENTS[r]) for r in TREE_ROWS], context_len=context[TREE_ROWS],
        mask=query_tree_mask(trees)[TREE_ROWS], num_tokens=num_tokens, device="cpu",
    )  # fmt: skip
    setattr(metadata, "adaptivespec_verification_plan", plan)
    expected = torch.empty(num_tokens, heads, dim, dtype=torch.float64)
    for r in range(3):
        ctx = int(context[r])
        for i in range(query_len[r]):
            visible = torch.zeros(int(seq_len[r]), dtype=torch.bool)
            if r in TREE_ROWS:
                visible[: ctx + 1] = True  # prefix and root
                if i > 0:
                    for j in ancestors(PARENTS[r], i - 1):
                        visible[ctx + 1 + j] = True
            else:
                visible[: ctx + i + 1] = True  # causal
            expected[start[r] + i] = brute_attention(query[start[r] + i], all_keys[r], all_values[r], visible, 0.2)
    branch = [start[r] + i for r in TREE_ROWS for i in range(chain_rows(PARENTS[r]), query_len[r])]
    return dict(query=query, key=key, value=value, cache=cache, metadata=metadata, plan=plan, expected=expected,
                branch=branch, heads=heads, kv_heads=kv_heads, dim=dim, num_tokens=num_tokens)  # fmt: skip


def test_target_tree_rows_are_computed_once_per_layer(monkeypatch):
    """vLLM's CPU kernel gets only the stock rows (plain rows and each tree's chain rows), the masked path
    only the branch rows, and together they give the brute-force result for every row."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from vllm_adaptivespec.engine import tree_attention

    batch = _verification_batch(cpu=True)
    stock_rows, masked_rows = [], []
    stock_forward, masked = CPUAttentionBackendImpl.forward, tree_attention.masked_attention

    def recording_stock(self, layer, query, key, value, kv_cache, attn_metadata, output, *args):
        stock_rows.append((query.shape[0], attn_metadata.num_actual_tokens, int(attn_metadata.query_start_loc[-1])))
        return stock_forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args)

    def recording_masked(query, *args):
        masked_rows.append(query.shape[0] * query.shape[1])
        return masked(query, *args)

    monkeypatch.setattr(CPUAttentionBackendImpl, "forward", recording_stock)
    monkeypatch.setattr(tree_attention, "masked_attention", recording_masked)
    impl = _cpu_impl(batch["heads"], batch["kv_heads"], batch["dim"], 0.2)
    output = torch.full((batch["num_tokens"], batch["heads"], batch["dim"]), 7.0)
    impl.forward(_Layer(), batch["query"], batch["key"], batch["value"], batch["cache"], batch["metadata"], output)
    branch = len(batch["branch"])  # 3 + 2 rows
    assert branch == 5 and batch["plan"].used
    assert stock_rows == [(batch["num_tokens"] - branch,) * 3]
    # One masked call over the branch rows: 2 tree requests x at most 3 branch rows, not their whole blocks.
    assert masked_rows == [2 * 3]
    torch.testing.assert_close(output.double(), batch["expected"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu-cache", "cuda-flash-cache-on-cpu-tensors"])
def test_verification_plan_writes_branch_rows_only(cpu):
    """The masked path (either cache layout) writes exactly the branch rows, with brute-force values; the
    stock rows' metadata cuts each tree request's query to its chain rows."""
    batch = _verification_batch(cpu)
    plan, metadata = batch["plan"], batch["metadata"]
    output = torch.full((batch["num_tokens"], batch["heads"], batch["dim"]), 7.0)
    impl = _impl(cpu, 0.2)
    plan.attend(impl, _Layer(), batch["query"], batch["cache"], metadata, output)
    untouched = torch.full((batch["heads"], batch["dim"]), 7.0)
    written = [row for row in range(batch["num_tokens"]) if not torch.equal(output[row], untouched)]
    assert written == batch["branch"]
    for row in written:
        torch.testing.assert_close(output[row].double(), batch["expected"][row], atol=1e-5, rtol=1e-5)
    assert sorted(plan.stock_rows.tolist() + batch["branch"]) == list(range(batch["num_tokens"]))

    made = {}

    class Backend:
        num_heads, num_kv_heads, head_size = batch["heads"], batch["kv_heads"], batch["dim"]

        def stock_rows_metadata(self, layer, metadata, query_start_loc, seq_lens, num_tokens, dtype):
            made.update(query_start_loc=query_start_loc.tolist(), seq_lens=seq_lens.tolist(), num_tokens=num_tokens)
            return "stock"

    assert plan.stock_metadata(Backend(), _Layer(), metadata, torch.float32) == "stock"
    assert plan.stock_metadata(Backend(), _Layer(), metadata, torch.float32) == "stock"  # once per forward
    # Request 0: root + 3 chain nodes of 7 rows; request 1: its 2 rows; request 2: root + 1 of 4 rows.
    assert made == {"query_start_loc": [0, 4, 6, 8], "seq_lens": [44, 9, 72], "num_tokens": 8}


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
    plan = DraftTreeAttention(block_table, prefix_len, [4, 4], max_tree_tokens=6)
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


def test_draft_tree_attention_works_on_the_growing_requests_only(monkeypatch):
    """Batch rows 0 (2 levels), 1 (1 level: done after the first pass) and 2 (4 levels): the prefix is read
    for rows 0 and 2 only, once per layer, and each pass attends for the requests that have rows in it."""
    from vllm_adaptivespec.engine import tree_attention

    gen = torch.Generator().manual_seed(4)
    heads, kv_heads, dim, block_size, blocks = 2, 1, 32, 32, 6
    prefix_len = torch.tensor([10, 5, 33])
    block_table = torch.tensor([[4, 0], [3, 0], [1, 2]])
    keys = {b: torch.randn(int(prefix_len[b]), kv_heads, dim, generator=gen) for b in range(3)}
    values = {b: torch.randn(int(prefix_len[b]), kv_heads, dim, generator=gen) for b in range(3)}
    slots = torch.tensor([int(block_table[b, p // block_size]) * block_size + p % block_size
                          for b in range(3) for p in range(int(prefix_len[b]))])  # fmt: skip
    cache = _filled_cache(True, blocks, kv_heads, block_size, dim, slots,
                          torch.cat([keys[b] for b in range(3)]), torch.cat([values[b] for b in range(3)]))  # fmt: skip
    gathered, attended = [], []
    gather, masked = tree_attention.gather_prefix, tree_attention.masked_attention
    monkeypatch.setattr(tree_attention, "gather_prefix",
                        lambda c, table, n: gathered.append(n.tolist()) or gather(c, table, n))  # fmt: skip
    monkeypatch.setattr(tree_attention, "masked_attention",
                        lambda q, *a: attended.append(q.shape[0]) or masked(q, *a))  # fmt: skip
    plan = DraftTreeAttention(block_table, prefix_len, [2, 1, 4], max_tree_tokens=6)
    assert plan.growing.tolist() == [2, 0]  # deepest first
    # Level 2 for rows 0 and 2, then levels 3 and 4 for row 2 alone (parents: slots of the earlier levels).
    parent_of: dict[tuple[int, int], int] = {}
    tree_keys: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for requests, parents in [([0, 0, 2, 2], [-1, -1, -1, -1]), ([2, 2], [0, 1]), ([2], [2])]:
        slot = plan.begin_pass(torch.tensor(requests), torch.tensor(parents))
        n = len(requests)
        query, key, value = (torch.randn(n, h, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
        for layer in range(2):
            output = torch.zeros(n, heads, dim)
            plan.attend(_impl(True, 0.5), type("L", (_Layer,), {"layer_name": f"layer.{layer}"})(),
                        query, key, value, cache, output)  # fmt: skip
        for i in range(n):
            b, s = requests[i], int(slot[i])
            parent_of[b, s], tree_keys[b, s] = parents[i], (key[i], value[i])
            path, node = [], s
            while node >= 0:
                path.append(node)
                node = parent_of[b, node]
            seen_keys = torch.cat([keys[b]] + [tree_keys[b, p][0][None] for p in reversed(path)])
            seen_values = torch.cat([values[b]] + [tree_keys[b, p][1][None] for p in reversed(path)])
            everything = torch.ones(len(seen_keys), dtype=torch.bool)
            expected = brute_attention(query[i], seen_keys, seen_values, everything, 0.5)
            torch.testing.assert_close(output[i].double(), expected, atol=1e-5, rtol=1e-5)
    assert slot.tolist() == [4]  # row 2's slots: 0, 1 (level 2), 2, 3 (level 3), 4
    assert gathered == [[33, 10], [33, 10]]  # once per layer, growing requests only
    assert attended == [2, 2, 1, 1, 1, 1]  # per pass and layer: the requests in that pass


def test_a_step_of_chains_builds_no_tree_objects(monkeypatch):
    """Tree mode, but every scheduled draft is a chain: no TreeStep, no DraftTrees (the causal kernel and
    the chain verifiers are exact); one real tree in the batch gets a step with that row as its tree row."""
    import numpy as np
    from types import SimpleNamespace

    from vllm_adaptivespec.engine import tree_step
    from vllm_adaptivespec.engine.state import DraftRecord

    def runner_and_state(records):
        batch = SimpleNamespace(num_reqs=3, req_id_to_index={"a": 0, "b": 1, "c": 2},
                                num_computed_tokens_cpu=np.array([10, 20, 30]))  # fmt: skip
        starts = SimpleNamespace(np=np.array([0, 4, 5, 8]))
        runner = SimpleNamespace(input_batch=batch, query_start_loc=starts)
        state = SimpleNamespace(drafts=dict(records))
        state.scheduled_parents = lambda rid, drafts: state.drafts.pop(rid).parents
        scheduled = {rid: record.tokens for rid, record in records.items()}
        return runner, state, SimpleNamespace(scheduled_spec_decode_tokens=scheduled, total_num_scheduled_tokens=8)

    chains = {"a": DraftRecord([5, 6, 7], [-1, 0, 1]), "c": DraftRecord([8, 9], [-1, 0])}
    built = []
    from_parents = DraftTrees.from_parents
    monkeypatch.setattr(tree_step.DraftTrees, "from_parents", lambda *a: built.append(a) or from_parents(*a))
    assert tree_step.TreeStep.of(*runner_and_state(chains)) is None
    assert built == []
    step = tree_step.TreeStep.of(*runner_and_state({**chains, "c": DraftRecord([8, 9], [-1, -1])}))
    assert step.tree_rows == [2] and step.chain_len == [4, 1, 2] and len(built) == 1
