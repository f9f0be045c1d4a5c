"""Per-runner AdaptiveSpec state: one policy per request, each request's pending draft tree, the
step being verified, step stats.

Lives in the worker next to vLLM's model runner. The proposer asks it for tree shapes and hands it
the trees it drafted (vLLM schedules only their flattened tokens); the margin sampler asks it for
each request's tau and promotion allowance and reports back what was accepted; it feeds that to
the request's policy and keeps counts for the metrics.
"""

from __future__ import annotations

import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.engine.request_params import request_tau
from vllm_adaptivespec.engine.verify_cost import DraftCost, VerifyCost
from vllm_adaptivespec.policy import PolicyBank, TreeShape, tree_capacity
from vllm_adaptivespec.tree import DraftTrees


@dataclass
class StepStats:
    """What one engine step did, shipped to the scheduler with the model runner output."""

    promoted: int = 0
    depth_counts: list[int] = field(default_factory=list)  # index = chosen depth
    draft_cost: float | None = None  # the drafter cost the policy priced depth with this step
    overhead_seconds: float = 0.0  # the plugin's own work this step (policy, bookkeeping, margin verification)

    def add_depths(self, depths: Iterable[int]) -> None:
        for depth in depths:
            if depth >= len(self.depth_counts):
                self.depth_counts.extend([0] * (depth + 1 - len(self.depth_counts)))
            self.depth_counts[depth] += 1


@dataclass(frozen=True)
class DraftRecord:
    """A request's drafted tree as vLLM will schedule it: flattened tokens and their parents."""

    tokens: list[int]
    parents: list[int]  # -1: child of the root (the request's last token)


@dataclass
class Verification:
    """The inputs the margin sampler needs for the batch it is verifying, in batch-row order."""

    tau: torch.Tensor  # [B] float
    allowance: torch.Tensor  # [B] long
    num_draft_tokens: list[int]
    trees: DraftTrees | None = None  # the scheduled trees, [B, max drafts]; None: every draft is a chain
    num_accepted: list[int] | None = None
    num_promoted: list[int] | None = None
    accepted_nodes: torch.Tensor | None = None  # [B, D] node indices of each accepted path, -1 padded
    overhead_seconds: float = 0.0  # time the margin sampler spent beyond vLLM's own rejection sampler

    def may_promote(self) -> bool:
        """Whether any request could accept a draft by the margin rule this step (else: strict)."""
        return bool(((self.tau < 1.0) & (self.allowance > 0)).any())

    def depths(self) -> list[int]:
        """Each row's draft depth (its longest acceptable path), what its policy observes."""
        if self.trees is None or self.trees.num_slots == 0:
            return list(self.num_draft_tokens)
        return self.trees.depths.amax(1).tolist()


class AdaptiveState:
    def __init__(self, config: AdaptiveSpecConfig, runner: Any, random_shapes_seed: int | None = None):
        self.config = config
        self.policies = PolicyBank(config)
        self._runner = runner
        self.step = StepStats()
        self.verification: Verification | None = None
        self.drafts: dict[str, DraftRecord] = {}
        self.tree_step = None  # the scheduled trees of the step in flight (engine.tree_step.TreeStep)
        self.cost = VerifyCost()  # target forward time by query tokens, measured by the runner hooks
        self.draft_cost = DraftCost()  # drafter pass vs target forward, measured by the proposer and the hooks
        self.forward_started: float | None = None
        self.step_outputs = None  # the target forward's hidden states and slot mappings of that step
        # Debug knob: shapes drawn at random every step (exercises every tree layout and KV move).
        self._random_shapes = None if random_shapes_seed is None else random.Random(random_shapes_seed)

    def request_ids(self) -> list[str]:
        return list(self._runner.input_batch.req_ids)

    def choose_shapes(self, confidence: torch.Tensor, node_ceiling: int) -> list[TreeShape]:
        """Each batch row's tree shape this step, from its policy and its first-pass confidence;
        at most ``node_ceiling`` nodes (what vLLM's draft buffers hold) and no more than the
        measured verification cost says pay off (``VerifyCost.node_cap``), but never below
        ``min_nodes`` (so a pinned shape stays pinned); depth priced by the measured drafter cost."""
        req_ids = self.request_ids()
        batch = len(req_ids)
        if self._random_shapes is not None:
            shapes = [self._random_shape(node_ceiling) for _ in req_ids]
        else:
            policies = [self.policies[rid] for rid in req_ids]
            acceptance = sum(p.acceptance_rate for p in policies) / max(1, batch)
            cap = min(node_ceiling, max(self.config.min_nodes, self.cost.node_cap(batch, acceptance, node_ceiling)))
            measured = self.draft_cost.ratio() if self.config.measure_draft_cost else None
            draft_cost = self.config.draft_cost if measured is None else measured
            self.step.draft_cost = draft_cost
            shapes = [
                policy.shape(float(confidence[row]), batch_size=batch, node_cap=cap, draft_cost=draft_cost)
                for row, policy in enumerate(policies)
            ]
        self.step.add_depths(shape.depth for shape in shapes)
        return shapes

    def _random_shape(self, node_ceiling: int) -> TreeShape:
        rng, cfg = self._random_shapes, self.config
        depth = rng.randint(1, min(cfg.max_depth, cfg.max_nodes, node_ceiling))
        width = 1 if cfg.mode == "chain" else rng.randint(1, cfg.max_width)
        nodes = rng.randint(depth, min(cfg.max_nodes, node_ceiling, tree_capacity(depth, width)))
        return TreeShape(depth, width, nodes)

    def record_drafts(self, trees: DraftTrees) -> list[list[int]]:
        """Remember each row's tree until vLLM schedules it; return the flattened token lists."""
        tokens, parents, counts = trees.tokens.tolist(), trees.parents.tolist(), trees.num_nodes.tolist()
        drafts = []
        for rid, row_tokens, row_parents, n in zip(self.request_ids(), tokens, parents, counts):
            self.drafts[rid] = DraftRecord(row_tokens[:n], row_parents[:n])
            drafts.append(row_tokens[:n])
        return drafts

    def scheduled_parents(self, req_id: str, scheduled: list[int]) -> list[int]:
        """Parents of the drafts vLLM scheduled for ``req_id``: a prefix of the recorded tree (the
        scheduler may cut drafts to its token budget, and a topological prefix is still a tree).
        Drafts we did not record (vLLM's zero drafts near max_model_len) are a chain."""
        record = self.drafts.pop(req_id, None)
        n = len(scheduled)
        if record is None or record.tokens[:n] != list(scheduled):
            return list(range(-1, n - 1))
        return record.parents[:n]

    @contextmanager
    def verifying(self, num_draft_tokens: list[int], trees: DraftTrees | None = None) -> Iterator[Verification]:
        """Expose the batch's verification inputs to the sampler, then feed back the outcome."""
        started = time.perf_counter()
        req_ids = self.request_ids()
        taus, allowances = [], []
        for rid in req_ids:
            request = self._runner.requests.get(rid)
            extra = getattr(getattr(request, "sampling_params", None), "extra_args", None)
            tau = request_tau(extra, self.config)
            taus.append(tau)
            allowances.append(self.policies[rid].promotion_allowance(tau))
        self.verification = Verification(
            tau=torch.tensor(taus, dtype=torch.float32),
            allowance=torch.tensor(allowances, dtype=torch.long),
            num_draft_tokens=list(num_draft_tokens),
            trees=trees,
        )
        self.charge(started)
        try:
            yield self.verification
            started = time.perf_counter()
            done = self.verification
            if done.num_accepted is not None:
                for rid, drafted, depth, accepted, promoted in zip(
                    req_ids, done.num_draft_tokens, done.depths(), done.num_accepted, done.num_promoted
                ):
                    if drafted:
                        self.policies[rid].observe(depth, accepted, promoted)
                self.step.promoted += sum(done.num_promoted)
            self.step.overhead_seconds += done.overhead_seconds
            self.charge(started)
        finally:
            self.verification = None

    def charge(self, started: float) -> None:
        """Count the time since ``started`` (``time.perf_counter()``) as the plugin's own work."""
        self.step.overhead_seconds += time.perf_counter() - started

    def take_step_stats(self) -> StepStats:
        stats, self.step = self.step, StepStats()
        return stats

    def free(self, req_ids: Iterable[str]) -> None:
        for rid in req_ids:
            self.policies.free(rid)
            self.drafts.pop(rid, None)
