"""Slow, obviously-correct Python versions of the core algorithms, one sequence at a time.

The unit tests compare the batched torch code against these."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch


# --- tree building ---------------------------------------------------------------------------


@dataclass
class PoolNode:
    id: int
    parent: int  # -1 = root
    token: int
    cum: torch.Tensor  # float32 scalar, summed exactly like the batched builder
    depth: int


def build_reference(shape, levels, max_width):
    """EAGLE-2 build for one sequence. ``levels[l]`` = (tokens [F, K], logprobs [F, K]) as handed to
    the builder at level l (F = 1 at level 1, max_width afterwards); log-probs must be finite or -inf.
    Returns (pool, kept ids, chain ids)."""
    pool: list[PoolNode] = []
    frontier = [(-1, torch.tensor(0.0))]  # (id, cum) per frontier slot; id -1 = root
    frontier_ok = [shape.depth >= 1]
    offset = 0
    for level, (tokens, logprobs) in enumerate(levels, start=1):
        new = []
        for f in range(len(frontier_ok)):
            order = list(range(tokens.shape[1]))
            if len(order) > max_width:  # the best width by log-prob, stable; otherwise as given
                order = sorted(order, key=lambda k: (-float(logprobs[f, k]), k))[:max_width]
            for slot in range(max_width):
                node_id = offset + f * max_width + slot
                if slot >= len(order):
                    continue
                k = order[slot]
                lp = logprobs[f, k].float()
                if not (frontier_ok[f] and slot < shape.width and math.isfinite(float(lp))):
                    continue
                node = PoolNode(node_id, frontier[f][0], int(tokens[f, k]), frontier[f][1] + lp.clamp(max=0), level)
                pool.append(node)
                new.append(node)
        level_slots = len(frontier_ok) * max_width
        if len(frontier_ok) == 1:  # the root's children become the frontier slot for slot
            by_id = {n.id: n for n in new}
            frontier, frontier_ok = [], []
            for slot in range(max_width):
                node = by_id.get(offset + slot)
                frontier.append((node.id, node.cum) if node else (-1, torch.tensor(0.0)))
                frontier_ok.append(node is not None and slot < shape.width and level < shape.depth)
        else:
            best = sorted(new, key=lambda n: (-float(n.cum), n.id))
            frontier = [(n.id, n.cum) for n in best[:max_width]]
            frontier_ok = [slot < shape.width and level < shape.depth for slot in range(len(frontier))]
            frontier += [(-1, torch.tensor(0.0))] * (max_width - len(frontier))
            frontier_ok += [False] * (max_width - len(frontier_ok))
        offset += level_slots
    ranked = sorted(pool, key=lambda n: (-float(n.cum), n.id))
    kept = {n.id for n in ranked[: shape.nodes]}
    chain = []
    current = -1
    while True:
        children = [n for n in pool if n.id in kept and n.parent == current]
        if not children:
            break
        child = min(children, key=lambda n: (-float(n.cum), n.id))
        chain.append(child.id)
        current = child.id
    return {n.id: n for n in pool}, kept, chain


# --- verification ----------------------------------------------------------------------------


def node_path(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def greedy_reference(logits, tokens, parents, tau, allowance, use_score):
    """Enumerate the root path of every node; return the candidates for the best path.

    Returns (best_len, candidate end nodes with their float64 path scores, next token for each
    candidate, promoted count for each candidate). The winner must be among the candidates of
    maximal length; with ``use_score`` its score must be maximal, else its index minimal."""
    logits = logits.float()
    n = len(tokens)
    top = [int(torch.argmax(logits[r])) for r in range(n + 1)]
    can_promote = tau < 1 and allowance > 0
    ok, promo, score = [], [], []
    for i in range(n):
        row = parents[i] + 1
        match = tokens[i] == top[row]
        ratio = math.exp(float(logits[row, tokens[i]]) - float(logits[row, top[row]]))
        p = (not match) and can_promote and ratio >= tau
        ok.append(match or p)
        promo.append(p)
        score.append(float(torch.log_softmax(logits[row].double(), 0)[tokens[i]]))
    eligible = {}
    for i in range(n):
        path = node_path(parents, i)
        if all(ok[j] for j in path) and sum(promo[j] for j in path) <= allowance:
            eligible[i] = (len(path), sum(score[j] for j in path), sum(promo[j] for j in path))
    if not eligible:
        return 0, {}, top
    best_len = max(v[0] for v in eligible.values())
    cands = {i: v for i, v in eligible.items() if v[0] == best_len}
    return best_len, cands, top


def sampled_reference(probs, tokens, parents, tau, allowance, uniforms, draft_probs=None):
    """The sequential walk of the module docstring, sibling by sibling, in float64.

    Returns (path, promoted flags, residual distribution for the next token, near_boundary) where
    near_boundary says a uniform or a margin ratio sat within 1e-5 of its threshold (float32 vs
    float64 may then legitimately disagree)."""
    probs = probs.double()
    n = len(tokens)
    current, used = -1, 0
    path, promoted = [], []
    near = False
    while True:
        row = probs[current + 1]
        children = [i for i in range(n) if parents[i] == current]
        residual = row.clone()
        chosen = None
        for j in children:
            total = float(residual.sum())
            if draft_probs is None:
                accept = float(residual[tokens[j]]) / total if total > 0 else 0.0
            else:
                q = float(draft_probs[j, tokens[j]])
                accept = min(1.0, float(row[tokens[j]]) / q) if q > 0 else 1.0
            near |= abs(uniforms[j] - accept) < 1e-5
            if uniforms[j] < accept:
                chosen = j
                break
            if draft_probs is None:
                residual[tokens[j]] = 0.0
            else:
                residual = (row - draft_probs[j].double()).clamp(min=0)
        was_promoted = False
        if chosen is None and tau < 1 and used < allowance:
            top = float(row.max())
            options = []
            for j in children:
                ratio = float(row[tokens[j]]) / top
                near |= abs(ratio - tau) < 1e-5
                if ratio >= tau:
                    options.append(j)
            if options:
                chosen = min(options, key=lambda j: (-float(row[tokens[j]]), j))
                was_promoted = True
                used += 1
        if chosen is None:
            if float(residual.sum()) <= 0:
                residual = row
            return path, promoted, residual / residual.sum(), near
        path.append(chosen)
        promoted.append(was_promoted)
        current = chosen


# --- random trees ----------------------------------------------------------------------------


def random_tree(rng: random.Random, max_nodes: int, vocab: int):
    n = rng.randint(0, max_nodes)
    parents = [rng.randint(-1, i - 1) for i in range(n)]
    tokens = [rng.randrange(vocab) for _ in range(n)]
    return tokens, parents


def chi_square_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells with tiny expectation are pooled into one."""
    total = counts.sum().double()
    expected = expected_probs.double() * total
    small = expected < 5
    counts = counts.double()
    obs = torch.cat([counts[~small], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)))
