"""Draft trees: the batched builder against a one-sequence Python build, and the derived views."""

from __future__ import annotations

import random

import pytest
import torch
from core_reference import build_reference, node_path, random_tree
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_adaptivespec.policy import TreeShape, tree_capacity
from vllm_adaptivespec.tree import DraftTrees, TreeBuilder, merge_chain

FAST = settings(max_examples=150, deadline=None, derandomize=True)


@st.composite
def tree_shapes(draw, max_depth=4, max_width=4):
    depth = draw(st.integers(0, max_depth))
    width = draw(st.integers(1, max_width))
    nodes = draw(st.integers(depth, tree_capacity(depth, width)))
    return TreeShape(depth, width, nodes)


def run_builder(shapes, seed, quantize):
    """Build with random candidates; returns the trees and the candidates fed at each level."""
    gen = torch.Generator().manual_seed(seed)
    builder = TreeBuilder(shapes)
    levels = []
    while not builder.done:
        ids, valid = builder.frontier()
        batch, frontier = ids.shape
        k = int(torch.randint(1, 6, (1,), generator=gen))
        tokens = torch.randint(0, 50, (batch, frontier, k), generator=gen)
        logprobs = torch.randn(batch, frontier, k, generator=gen).log_softmax(-1)
        if quantize:  # coarse values: many exact ties between siblings and cousins
            logprobs = (logprobs * 2).round() / 2
        logprobs[torch.rand(batch, frontier, k, generator=gen) < 0.1] = float("-inf")
        builder.add_level(tokens, logprobs)
        levels.append((tokens, logprobs))
    return builder, builder.finish(), levels


@FAST
@given(st.lists(tree_shapes(), min_size=1, max_size=4), st.integers(0, 2**31 - 1), st.booleans())
def test_builder_matches_one_sequence_reference(shapes, seed, quantize):
    builder, trees, levels = run_builder(shapes, seed, quantize)
    trees.validate()
    for b, shape in enumerate(shapes):
        pool, kept, chain = build_reference(
            shape, [(tokens[b], logprobs[b]) for tokens, logprobs in levels], builder.max_width
        )
        n = int(trees.num_nodes[b])
        ids = trees.builder_ids[b, :n].tolist()
        assert set(ids) == kept
        assert n <= shape.nodes and max(trees.depths[b, :n].tolist(), default=0) <= shape.depth
        # Layout: top-1 chain first, then (depth, -cum, creation order).
        assert ids[: len(chain)] == chain
        rest = sorted(kept - set(chain), key=lambda i: (pool[i].depth, -float(pool[i].cum), i))
        assert ids[len(chain) :] == rest
        for i, node_id in enumerate(ids):
            node = pool[node_id]
            assert int(trees.tokens[b, i]) == node.token
            assert int(trees.depths[b, i]) == node.depth
            assert float(trees.cum_logprobs[b, i]) == float(node.cum)
            parent = int(trees.parents[b, i])
            assert parent < i
            assert (parent == -1 and node.parent == -1) or ids[parent] == node.parent
        assert (trees.parents[b, n:] == -2).all() and (trees.builder_ids[b, n:] == -1).all()


def test_builder_fills_each_shape_when_candidates_suffice():
    shapes = [TreeShape(4, 3, 10), TreeShape(2, 1, 2), TreeShape(3, 2, 10), TreeShape(1, 4, 4)]
    builder = TreeBuilder(shapes)
    gen = torch.Generator().manual_seed(0)
    while not builder.done:
        ids, _ = builder.frontier()
        builder.add_level(torch.randint(0, 99, (*ids.shape, 4), generator=gen),
                          torch.randn(*ids.shape, 4, generator=gen).log_softmax(-1))
    trees = builder.finish()
    assert trees.num_nodes.tolist() == [s.nodes for s in shapes]
    assert all(int(trees.depths[b].max()) <= s.depth for b, s in enumerate(shapes))


def test_width_one_build_is_the_chain_constructor():
    gen = torch.Generator().manual_seed(5)
    depths = [3, 5, 1, 0]
    builder = TreeBuilder([TreeShape(d, 1, d) for d in depths])
    drafted, logps = [], []
    while not builder.done:
        ids, _ = builder.frontier()
        tokens = torch.randint(0, 99, (*ids.shape, 1), generator=gen)
        logprobs = -torch.rand(*ids.shape, 1, generator=gen)
        builder.add_level(tokens, logprobs)
        drafted.append(tokens[:, 0, 0])
        logps.append(logprobs[:, 0, 0])
    trees = builder.finish()
    chain = DraftTrees.chain(torch.stack(drafted, 1), torch.tensor(depths), torch.stack(logps, 1))
    for name in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(trees, name), getattr(chain, name)), name
    assert torch.allclose(trees.cum_logprobs, chain.cum_logprobs)
    assert trees.max_depth == chain.max_depth == 5


def brute_ancestors(parents, i):
    return set(node_path(parents, i))


def test_ancestor_mask_positions_and_paths_match_brute_force():
    rng = random.Random(21)
    for _ in range(30):
        sample = [random_tree(rng, 9, 6) for _ in range(rng.randint(1, 6))]
        trees = DraftTrees.from_parents([s[0] for s in sample], [s[1] for s in sample])
        trees.validate()
        mask = trees.ancestor_mask()
        context = torch.tensor([rng.randint(0, 100) for _ in sample])
        positions = trees.positions(context)
        paths = trees.paths()
        for b, (tokens, parents) in enumerate(sample):
            n = len(tokens)
            for i in range(trees.num_slots):
                want = brute_ancestors(parents, i) if i < n else {i}
                assert {j for j in range(trees.num_slots) if mask[b, i, j]} == want
                depth = len(node_path(parents, i)) if i < n else 0
                assert int(positions[b, i]) == int(context[b]) + depth
            leaves = [i for i in range(n) if i not in set(parents)]
            got = [[x for x in row if x >= 0] for row in paths[b].tolist()]
            assert [g for g in got if g] == [node_path(parents, leaf) for leaf in leaves]


def test_builder_tree_views_are_consistent():
    shapes = [TreeShape(3, 3, 12), TreeShape(4, 2, 7)]
    _, trees, _ = run_builder(shapes, seed=11, quantize=True)
    mask = trees.ancestor_mask()
    for b in range(2):
        for i in range(int(trees.num_nodes[b])):
            assert int(mask[b, i].sum()) == int(trees.depths[b, i])  # ancestors + self = depth
            parent = int(trees.parents[b, i])
            if parent >= 0:
                assert torch.equal(mask[b, i] & ~torch.nn.functional.one_hot(torch.tensor(i), trees.num_slots).bool(),
                                   mask[b, parent])


def test_from_parents_rejects_non_topological_input():
    with pytest.raises(ValueError, match="parent of node 1 is 1"):
        DraftTrees.from_parents([[1, 2]], [[-1, 1]])


def test_add_level_checks_shapes_and_level_count():
    builder = TreeBuilder([TreeShape(1, 2, 2)])
    with pytest.raises(ValueError, match="candidates must be"):
        builder.add_level(torch.zeros(1, 2, 2, dtype=torch.long), torch.zeros(1, 2, 2))
    builder.add_level(torch.tensor([[[4, 5]]]), torch.tensor([[[-0.1, -0.2]]]))
    with pytest.raises(RuntimeError):
        builder.add_level(torch.tensor([[[4, 5]]]), torch.tensor([[[-0.1, -0.2]]]))
    trees = builder.finish()
    assert trees.tokens.tolist() == [[4, 5]] and trees.parents.tolist() == [[-1, -1]]


def test_no_draft_shapes_give_empty_trees():
    trees = TreeBuilder([TreeShape(0, 1, 0), TreeShape(0, 3, 0)]).finish()
    assert trees.num_slots == 0 and trees.num_nodes.tolist() == [0, 0]
    assert trees.ancestor_mask().shape == (2, 0, 0)


def test_tree_shape_invariants():
    assert TreeShape(3, 1, 3).is_chain and not TreeShape(2, 2, 2).is_chain
    with pytest.raises(ValueError):
        TreeShape(3, 1, 4)  # a width-1 tree holds exactly depth nodes
    with pytest.raises(ValueError):
        TreeShape(3, 2, 2)


@FAST
@given(st.integers(0, 2**31 - 1), st.integers(0, 12), st.lists(st.integers(0, 3), max_size=8), st.integers(0, 16))
def test_merge_chain_adds_the_chain_as_a_root_path_against_brute_force(seed, max_nodes, chain, limit):
    # A tree without two siblings of one token (as the drafter builds them: top-k candidates are distinct).
    rng = random.Random(seed)
    tokens, parents = random_tree(rng, max_nodes, vocab=4)
    seen, keep = set(), []
    for i, (t, p) in enumerate(zip(tokens, parents)):
        if (p, t) not in seen and (p < 0 or p in keep):
            seen.add((p, t))
            keep.append(i)
    index = {old: new for new, old in enumerate(keep)}
    tokens = [tokens[i] for i in keep]
    parents = [index[parents[i]] if parents[i] >= 0 else -1 for i in keep]
    n = len(tokens)
    spelled = {tuple(tokens[j] for j in node_path(parents, i)) for i in range(n)}  # every node's root path
    matched = max((m for m in range(len(chain) + 1) if m == 0 or tuple(chain[:m]) in spelled), default=0)

    new_tokens, new_parents, path = merge_chain(tokens, parents, chain, limit)

    assert new_tokens[:n] == tokens and new_parents[:n] == parents
    assert all(-1 <= p < i for i, p in enumerate(new_parents))
    assert len({(p, t) for p, t in zip(new_parents, new_tokens)}) == len(new_tokens)  # no twin siblings
    assert [new_tokens[i] for i in path] == chain[: len(path)]
    assert all(new_parents[node] == (path[j - 1] if j else -1) for j, node in enumerate(path))
    assert len(path) == min(len(chain), matched + max(0, limit - n))
    assert len(new_tokens) == n + len(path) - min(matched, len(path))


def test_merge_chain_worked_example():
    assert merge_chain([5, 6, 7], [-1, 0, -1], [5, 8, 9], limit=4) == ([5, 6, 7, 8], [-1, 0, -1, 0], [0, 3])
