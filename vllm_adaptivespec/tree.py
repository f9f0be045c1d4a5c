"""Draft trees for a batch: built level by level from the drafter's candidates, then flattened.

Build (EAGLE-2 style, per sequence b with shape (depth_b, width_b, nodes_b)):
  level 1: the root (the last committed token) gets the drafter's top-``width_b`` candidates;
  level l > 1: each of the ``width_b`` frontier nodes gets its top-``width_b`` candidates;
  the next frontier is the ``width_b`` best new nodes by cumulative draft log-prob.
  At the end the ``nodes_b`` best nodes overall by cumulative log-prob are kept. Log-probs are
  clamped to <= 0 so a child never outranks its parent, and ties keep creation order, so the
  kept set is always ancestor-closed.

Layout of the flattened, padded ``DraftTrees`` (the engine relies on it for cheap KV moves):
  * ``parents[b, i] < i`` (topological); -1 = child of the root; -2 = padding;
  * the top-1 chain (from the root, repeatedly the likeliest kept child) fills 0..k-1;
  * the other kept nodes follow in (depth, -cumulative log-prob) order;
  * valid nodes are 0..num_nodes[b]-1; padding has token 0, depth 0, cum log-prob -inf.
A chain is the width-1 tree: same tensors, same code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from vllm_adaptivespec.policy import TreeShape

ROOT = -1
PAD = -2


@dataclass
class DraftTrees:
    """A padded batch of flattened draft trees (see the module docstring for the layout)."""

    tokens: torch.Tensor  # [B, N] long
    parents: torch.Tensor  # [B, N] long
    depths: torch.Tensor  # [B, N] long; children of the root have depth 1
    cum_logprobs: torch.Tensor  # [B, N] float; sum of draft log-probs from the root
    num_nodes: torch.Tensor  # [B] long
    builder_ids: torch.Tensor | None = None  # [B, N] long: node ids of the TreeBuilder that made it, -1 pad
    max_depth: int | None = None  # deepest node over the batch; computed when not given

    def __post_init__(self) -> None:
        if self.max_depth is None:
            self.max_depth = int(self.depths.max().item()) if self.depths.numel() else 0
        # Derived views, computed once: the engine (attention) and the verifier both need them.
        self._node_mask: torch.Tensor | None = None
        self._ancestor_ids: torch.Tensor | None = None
        self._ancestor_mask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_slots(self) -> int:
        """N, the padded number of nodes per sequence."""
        return self.tokens.shape[1]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @property
    def node_mask(self) -> torch.Tensor:
        """[B, N] bool: real (non-padding) nodes."""
        if self._node_mask is None:
            self._node_mask = torch.arange(self.num_slots, device=self.device) < self.num_nodes[:, None]
        return self._node_mask

    def to(self, device: torch.device | str) -> DraftTrees:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return DraftTrees(
            move(self.tokens),
            move(self.parents),
            move(self.depths),
            move(self.cum_logprobs),
            move(self.num_nodes),
            move(self.builder_ids),
            self.max_depth,
        )

    def ancestor_ids(self) -> torch.Tensor:
        """[B, N, D] long: entry [b, i, d] is the node at depth d + 1 on node i's root path (node i
        itself at d = depth_i - 1), -1 beyond it and for padding. Row i is i's root path, in order.
        Computed once per tree (treat the tensors of a DraftTrees as read-only)."""
        if self._ancestor_ids is None:
            batch, slots, depth = self.batch_size, self.num_slots, self.max_depth
            valid = self.node_mask
            # Walk up from every node at once; slot N stands for "none" and maps to itself.
            parent = torch.where(valid & (self.parents >= 0), self.parents, slots)
            parent = torch.cat([parent, torch.full((batch, 1), slots, dtype=torch.long, device=self.device)], 1)
            current = torch.where(valid, torch.arange(slots, device=self.device), slots)
            walk = [current]
            for _ in range(depth - 1):
                current = parent.gather(1, current)
                walk.append(current)
            up = torch.stack(walk, dim=2)  # [B, N, D]: self, parent, grandparent, ...
            steps = torch.arange(depth, device=self.device)
            column = torch.where(up < slots, self.depths.unsqueeze(2) - 1 - steps, depth)
            ids = torch.full((batch, slots, depth + 1), -1, dtype=torch.long, device=self.device)
            self._ancestor_ids = ids.scatter_(2, column, up)[:, :, :depth]
        return self._ancestor_ids

    def ancestor_mask(self) -> torch.Tensor:
        """[B, N, N] bool: mask[b, i, j] is True when node j is node i or one of its ancestors.

        The root (last committed token) is not a node: every node also sees it and the context.
        Padding nodes see only themselves, so no attention row is empty. Computed once per tree."""
        if self._ancestor_mask is None:
            batch, slots = self.batch_size, self.num_slots
            ids = self.ancestor_ids()
            mask = torch.zeros(batch, slots, slots + 1, dtype=torch.bool, device=self.device)
            mask.scatter_(2, torch.where(ids >= 0, ids, slots), True)
            self._ancestor_mask = mask[:, :, :slots] | torch.eye(slots, dtype=torch.bool, device=self.device)
        return self._ancestor_mask

    def positions(self, context_len: torch.Tensor) -> torch.Tensor:
        """[B, N] token positions: ``context_len`` is the root's position (tokens already in the
        KV cache); a node at depth d sits at context_len + d. Padding gets the root's position."""
        return context_len.to(self.depths.device)[:, None] + self.depths

    def paths(self) -> torch.Tensor:
        """[B, L, D] root-to-leaf paths as node indices (-1 padded); leaves in index order, L = most leaves."""
        batch, slots = self.parents.shape
        valid = self.node_mask
        has_child = torch.zeros(batch, slots + 1, dtype=torch.bool, device=self.device)
        has_child.scatter_(1, torch.where(valid & (self.parents >= 0), self.parents, slots), True)
        leaf = valid & ~has_child[:, :slots]
        num_leaves = int(leaf.sum(1).max().item()) if slots else 0
        leaves = (~leaf).to(torch.int8).argsort(dim=1, stable=True)[:, :num_leaves]
        depth = self.max_depth
        paths = self.ancestor_ids().gather(1, leaves.unsqueeze(2).expand(batch, num_leaves, depth))
        return torch.where(leaf.gather(1, leaves).unsqueeze(2), paths, -1)

    def validate(self) -> None:
        """Raise ValueError unless the tensors follow the documented layout (for tests and debugging)."""
        batch, slots = self.tokens.shape
        for name in ("parents", "depths", "cum_logprobs"):
            if getattr(self, name).shape != (batch, slots):
                raise ValueError(f"DraftTrees.{name} has shape {tuple(getattr(self, name).shape)}, want {(batch, slots)}")
        valid = self.node_mask
        index = torch.arange(slots, device=self.device)
        if ((self.parents >= index) & valid).any() or ((self.parents < ROOT) & valid).any():
            raise ValueError("DraftTrees.parents must satisfy -1 <= parents[i] < i for real nodes")
        if ((self.parents != PAD) & ~valid).any():
            raise ValueError("DraftTrees padding must have parent -2")
        parent_depth = torch.where(self.parents >= 0, self.depths.gather(1, self.parents.clamp(min=0)), 0)
        if ((self.depths != parent_depth + 1) & valid).any():
            raise ValueError("DraftTrees.depths must be parent depth + 1 (children of the root: 1)")

    @classmethod
    def chain(
        cls,
        tokens: torch.Tensor,
        num_nodes: torch.Tensor | None = None,
        logprobs: torch.Tensor | None = None,
    ) -> DraftTrees:
        """Plain chains: ``tokens`` [B, K] drafted in order; optional lengths and per-token draft log-probs."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        batch, length = tokens.shape
        device = tokens.device
        index = torch.arange(length, device=device)
        if num_nodes is None:
            num_nodes = torch.full((batch,), length, dtype=torch.long, device=device)
        num_nodes = torch.as_tensor(num_nodes, dtype=torch.long, device=device).clamp(0, length)
        valid = index < num_nodes[:, None]
        if logprobs is None:
            cum = torch.zeros(batch, length, device=device)
        else:
            cum = torch.as_tensor(logprobs, dtype=torch.float32, device=device).clamp(max=0).cumsum(1)
        depth = int(num_nodes.max().item()) if batch else 0
        trees = cls(
            tokens=torch.where(valid, tokens, 0),
            parents=torch.where(valid, index - 1, PAD),
            depths=torch.where(valid, index + 1, 0),
            cum_logprobs=torch.where(valid, cum, float("-inf")),
            num_nodes=num_nodes,
            max_depth=depth,
        )
        # A chain's root paths are known without walking it: node i's path is 0..i.
        trees._node_mask = valid
        on_path = (index[None, :] <= index[:, None]) & valid[:, :, None]  # [B, K, K]
        trees._ancestor_ids = torch.where(on_path, index, -1)[:, :, :depth]
        return trees

    @classmethod
    def from_parents(
        cls,
        tokens: Sequence[Sequence[int]],
        parents: Sequence[Sequence[int]],
        logprobs: Sequence[Sequence[float]] | None = None,
        device: torch.device | str | None = None,
    ) -> DraftTrees:
        """Trees given per sequence as token and parent lists (parents[i] in [-1, i)); log-probs
        are each node's own draft log-prob. Only topological order is required here."""
        batch = len(tokens)
        slots = max((len(t) for t in tokens), default=0)
        tok = torch.zeros(batch, slots, dtype=torch.long)
        par = torch.full((batch, slots), PAD, dtype=torch.long)
        dep = torch.zeros(batch, slots, dtype=torch.long)
        cum = torch.full((batch, slots), float("-inf"))
        for b in range(batch):
            if len(parents[b]) != len(tokens[b]):
                raise ValueError(f"sequence {b}: {len(tokens[b])} tokens but {len(parents[b])} parents")
            depths: list[int] = []
            sums: list[float] = []
            for i, p in enumerate(parents[b]):
                if not ROOT <= p < i:
                    raise ValueError(f"sequence {b}: parent of node {i} is {p}, must be in [-1, {i})")
                own = min(0.0, float(logprobs[b][i])) if logprobs is not None else 0.0
                depths.append(1 if p < 0 else depths[p] + 1)
                sums.append(own if p < 0 else sums[p] + own)
            n = len(tokens[b])
            tok[b, :n] = torch.tensor(list(tokens[b]), dtype=torch.long)
            par[b, :n] = torch.tensor(list(parents[b]), dtype=torch.long)
            dep[b, :n] = torch.tensor(depths, dtype=torch.long)
            cum[b, :n] = torch.tensor(sums)
        num = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        trees = cls(tok, par, dep, cum, num)
        return trees if device is None else trees.to(device)


def merge_chain(
    tokens: Sequence[int], parents: Sequence[int], chain: Sequence[int], limit: int
) -> tuple[list[int], list[int], list[int]]:
    """One flattened tree (``tokens``, ``parents``: [nodes], parents[i] in [-1, i)) with ``chain`` (tokens
    in order from the root) added as a root path: followed down the tree while a child of the path's
    last node holds the chain's next token, the rest appended as new nodes, each the child of the one
    before, while the tree has fewer than ``limit`` nodes.

    Returns (tokens, parents, path), new lists: the given nodes keep their places (so a drafter tree's
    top-1 chain still fills 0..k-1), the new ones follow in order (topological), no node gets two
    children with one token, and ``path[j]`` is the node of chain token j (as many as fit).

    Worked example: tokens [5, 6, 7], parents [-1, 0, -1] (5 -> 6, and 7), chain [5, 8, 9], limit 4:
    5 is node 0; no child of 0 holds 8, so 8 becomes node 3 (parent 0); the limit stops 9.
    -> tokens [5, 6, 7, 8], parents [-1, 0, -1, 0], path [0, 3]."""
    tokens, parents, path = list(tokens), list(parents), []
    parent = ROOT
    for token in chain:
        node = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == parent and t == token), None)
        if node is None:
            if len(tokens) >= limit:
                break
            tokens.append(token)
            parents.append(parent)
            node = len(tokens) - 1
        path.append(node)
        parent = node
    return tokens, parents, path


class TreeBuilder:
    """Builds a batch of draft trees level by level; one ``add_level`` call per drafter step.

    Node ids handed out by ``frontier()`` number the nodes in creation order (level by level,
    frontier slot by slot, candidate by candidate); ``DraftTrees.builder_ids`` maps the final
    layout back to them. A node is absent (never kept) while its cumulative log-prob is -inf,
    which is how unused width slots, finished sequences and missing candidates are marked."""

    def __init__(self, shapes: Sequence[TreeShape], device: torch.device | str | None = None):
        self.shapes = list(shapes)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        batch = len(self.shapes)
        self.max_depth = max((s.depth for s in self.shapes), default=0)
        self.max_width = max((s.width for s in self.shapes), default=1)
        dims = torch.tensor([[s.depth, s.width, s.nodes] for s in self.shapes], dtype=torch.long).reshape(batch, 3)
        depth, width, self._nodes = dims.to(self.device).unbind(1)
        absent = float("-inf")
        # Added to cumulative log-probs: 0 where a sequence uses a width slot / is still growing, -inf elsewhere.
        slot = torch.arange(self.max_width, device=self.device)
        self._slot_ids = slot.expand(batch, self.max_width)
        slot_bias = torch.where(slot < width[:, None], 0.0, absent)  # [B, W]
        level = torch.arange(self.max_depth + 1, device=self.device)
        open_bias = torch.where(level[:, None, None] < depth[None, :, None], 0.0, absent)  # [levels, B, 1]
        self._candidate_bias = slot_bias.unsqueeze(1)  # [B, 1, W]
        self._frontier_bias = open_bias + slot_bias  # [levels, B, W]
        self.level = 0
        self._frontier_ids = torch.full((batch, 1), ROOT, dtype=torch.long, device=self.device)
        self._frontier_cum = open_bias[0].clone()
        self._levels: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # tokens, cum, frontier ids
        self._size = 0

    @property
    def batch_size(self) -> int:
        return len(self.shapes)

    @property
    def done(self) -> bool:
        return self.level >= self.max_depth

    def frontier(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, F] node ids to expand next, -1 = the root or padding; [B, F] bool: really expand)."""
        valid = self._frontier_cum > float("-inf")
        return torch.where(valid, self._frontier_ids, ROOT), valid

    def frontier_tokens(self) -> torch.Tensor:
        """[B, F] tokens of the frontier nodes (0 for the root and padding)."""
        ids, valid = self.frontier()
        if not self._levels:
            return torch.zeros_like(ids)
        tokens = torch.cat([level[0] for level in self._levels], dim=1)
        return torch.where(valid & (ids >= 0), tokens.gather(1, ids.clamp(min=0)), 0)

    def nodes_so_far(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """([B, P] tokens, [B, P] parent ids (-1 root), [B, P] bool present) of every node created
        so far, indexed by node id: what the drafter's own tree attention needs between levels."""
        if not self._levels:
            empty = torch.zeros(self.batch_size, 0, dtype=torch.long, device=self.device)
            return empty, empty, empty.bool()
        tokens, cum, parents = self._pool()
        return tokens, parents, cum > float("-inf")

    def _pool(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.cat([level[0] for level in self._levels], dim=1)
        # Frontiers hold 1, W, W, ... slots and levels W, W*W, W*W, ... nodes: node j's parent is
        # frontier slot j // W of the concatenated frontiers.
        frontiers = torch.cat([level[2] for level in self._levels], dim=1)
        slot = torch.arange(tokens.shape[1], device=self.device) // self.max_width
        parents = frontiers.gather(1, slot.expand(tokens.shape[0], -1))
        return tokens, torch.cat([level[1] for level in self._levels], dim=1), parents

    def add_level(self, cand_tokens: torch.Tensor, cand_logprobs: torch.Tensor) -> None:
        """Expand the frontier: ``cand_tokens`` / ``cand_logprobs`` are [B, F, K] (any K >= 1), the
        drafter's candidates for each frontier node. With K > width each sequence keeps its best
        ``width`` (stable, so equal log-probs keep the given order); with K <= width all are used,
        in the given order. Non-finite log-probs mark a candidate as absent."""
        if self.done:
            raise RuntimeError(f"all {self.max_depth} levels are already built")
        batch, frontier = self._frontier_cum.shape
        if cand_tokens.shape[:2] != (batch, frontier) or cand_logprobs.shape != cand_tokens.shape:
            raise ValueError(
                f"candidates must be [B={batch}, F={frontier}, K]; got tokens {tuple(cand_tokens.shape)} "
                f"and log-probs {tuple(cand_logprobs.shape)}"
            )
        width = self.max_width
        absent = float("-inf")
        logprobs = cand_logprobs.to(device=self.device, dtype=torch.float32)
        logprobs = logprobs.nan_to_num(nan=absent, posinf=absent, neginf=absent)
        tokens = cand_tokens.to(device=self.device, dtype=torch.long)
        count = logprobs.shape[2]
        if count > width:
            logprobs, order = logprobs.sort(dim=2, descending=True, stable=True)
            logprobs, tokens = logprobs[:, :, :width], tokens.gather(2, order[:, :, :width])
        elif count < width:
            logprobs = torch.nn.functional.pad(logprobs, (0, width - count), value=absent)
            tokens = torch.nn.functional.pad(tokens, (0, width - count), value=0)
        cum = self._frontier_cum.unsqueeze(2) + logprobs.clamp(max=0.0) + self._candidate_bias
        cum = cum.reshape(batch, frontier * width)
        self._levels.append((tokens.reshape(batch, frontier * width), cum, self._frontier_ids))
        self.level += 1
        if not self.done:
            if frontier == 1:  # all width new nodes form the next frontier, slot for slot
                best_cum, best = cum, self._slot_ids
            else:
                best_cum, best = cum.sort(dim=1, descending=True, stable=True)
                best_cum, best = best_cum[:, :width], best[:, :width]
            self._frontier_cum = best_cum + self._frontier_bias[self.level]
            self._frontier_ids = best + self._size
        self._size += frontier * width

    def finish(self) -> DraftTrees:
        """Keep each sequence's best ``nodes`` nodes and flatten them into the documented layout."""
        batch, device = self.batch_size, self.device
        if not self._levels:
            empty = torch.zeros(batch, 0, dtype=torch.long, device=device)
            return DraftTrees(
                empty, empty.clone(), empty.clone(), empty.float(), torch.zeros(batch, dtype=torch.long, device=device),
                empty.clone(), 0,
            )
        tokens, cum, parents = self._pool()
        pool = tokens.shape[1]
        depth = torch.tensor(
            [level for level, (nodes, _, _) in enumerate(self._levels, start=1) for _ in range(nodes.shape[1])],
            device=device,
        )
        pool_index = torch.arange(pool, device=device).expand(batch, pool)

        # Rank by cumulative log-prob; the stable sort keeps creation order on ties, so an ancestor
        # (never less likely, created earlier) always ranks before its descendants.
        order = cum.sort(dim=1, descending=True, stable=True)[1]
        rank = torch.empty_like(order).scatter_(1, order, pool_index)
        num_nodes = torch.minimum(self._nodes, (cum > float("-inf")).sum(1))
        keep = rank < num_nodes[:, None]

        # Top-1 chain: each parent's best kept child is its lowest-ranked one. Slot p = node p,
        # slot P = the root, slot P + 1 = "none" (absorbing), so the walk is one gather per level.
        slot_parent = torch.where(parents >= 0, parents, pool)
        best_rank = torch.full((batch, pool + 2), pool, dtype=torch.long, device=device)
        best_rank.scatter_reduce_(1, slot_parent, torch.where(keep, rank, pool), reduce="amin")
        best_child = torch.where(best_rank < pool, order.gather(1, best_rank.clamp(max=pool - 1)), pool + 1)
        step = best_child[:, pool : pool + 1]
        walk = [step]
        for _ in range(len(self._levels) - 1):
            step = best_child.gather(1, step)
            walk.append(step)
        on_chain = torch.zeros(batch, pool + 2, dtype=torch.bool, device=device)
        on_chain = on_chain.scatter_(1, torch.cat(walk, dim=1), True)[:, :pool]

        # Layout key: (chain first | other kept | dropped, depth, rank).
        group = 2 - keep.long() - on_chain.long()
        key = group * ((len(self._levels) + 1) * pool) + depth * pool + rank
        layout = key.argsort(dim=1)
        slots, max_depth = (
            torch.stack([num_nodes.max(), torch.where(keep, depth, 0).max()]).tolist() if batch else (0, 0)
        )
        position = torch.empty_like(layout).scatter_(1, layout, pool_index)
        chosen = layout[:, :slots]
        real = torch.arange(slots, device=device) < num_nodes[:, None]
        chosen_parents = parents.gather(1, chosen)
        new_parents = torch.where(chosen_parents >= 0, position.gather(1, chosen_parents.clamp(min=0)), ROOT)
        trees = DraftTrees(
            tokens=torch.where(real, tokens.gather(1, chosen), 0),
            parents=torch.where(real, new_parents, PAD),
            depths=torch.where(real, depth.expand(batch, pool).gather(1, chosen), 0),
            cum_logprobs=torch.where(real, cum.gather(1, chosen), float("-inf")),
            num_nodes=num_nodes,
            builder_ids=torch.where(real, chosen, -1),
            max_depth=max_depth,
        )
        trees._node_mask = real
        return trees
