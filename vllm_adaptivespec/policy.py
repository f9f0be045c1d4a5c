"""Per-sequence policy: how deep, how wide and how many draft nodes this step.

Each request keeps a rolling window of its last ``history_window`` steps. The shape of the
next draft tree is a function of one fused signal in [0, 1]:

    a = sum(accepted) / sum(trials)        over the window; ``prior_acceptance`` before any step
        trials of a step = accepted + (1 if accepted < drafted else 0), i.e. the number of
        positions the target actually judged; a is the per-position acceptance estimate and
        does not shrink just because a deeper tree was drafted
    c = drafter's top-1 probability at the first draft position (clamped to [0, 1], NaN -> 0)
    s = confidence_weight * c + (1 - confidence_weight) * a

    depth_s = the d in [min_depth, max_depth] maximising (1 + s + s**2 + ... + s**d) / (1 + draft_cost * d)
              (largest on ties): s read as the chance each further draft token is accepted, the
              numerator is the expected tokens a depth-d chain emits per step and the denominator the
              step's cost in target-step units (d drafter passes + one verification). A sure drafter
              drafts deep, an unsure one shallow, and an expensive drafter (CPU, large draft model)
              shallower than a cheap one (EAGLE head). Monotone in s: the gain of d+1 over d,
              s**(d+1) / (1 + ... + s**d), rises with s.
    ramp(s, lo, hi) = clamp((s - lo) / (hi - lo), 0, 1)
    width   = max_width - min(max_width - min_width, floor(ramp(s, wide_below, narrow_above) * (max_width - min_width + 1)))
              (width = 1 in mode "chain")

    cap      = min(max_nodes, max(min_nodes, batch_node_budget // batch_size), node_cap)
    depth    = min(depth_s, cap)
    capacity = width + (depth - 1) * width**2      nodes a depth x width EAGLE-2 build creates
    nodes    = clamp(depth * width, min(max(depth, min_nodes), cap, capacity), min(cap, capacity))

So a confident drafter with a good history gets a deep narrow tree (a chain above
``narrow_above``), an unsure one a shallow wide tree, and the node count follows the shape
(depth * width) instead of being a fixed budget redistributed. Guarantees (tested): depth is
non-decreasing and width non-increasing in s; depth <= nodes <= min(max_nodes, batch cap,
node_cap, capacity); nodes and depth are non-increasing in batch_size; a chain has nodes == depth.
A hardware ``node_cap`` below ``min_depth`` wins over ``min_depth``.

Lossy budget: ``promotion_allowance()`` is how many margin promotions the next step may use,
min(max_promotions_per_step, max_promotions_per_window - promotions in the previous
history_window - 1 steps), so no run of ``history_window`` consecutive steps ever holds more
than ``max_promotions_per_window`` promotions; it is 0 when the step's tau (the request's, else
the configured one) is 1, or while the agreement rate is below ``promotion_min_acceptance``:

    agreement = (sum(accepted) - sum(promoted)) / sum(trials)     over this drafter's steps in the window;
                                                                  ``prior_acceptance`` before any judged position

the share of judged positions where the drafter picked the target's own choice, so promotions never vouch for
more promotions; a drafter that disagrees is where a promoted near-tie starts an error later tokens build on. A step
whose draft came from another source (a free copy) enters the window with its promotions only
(``observe_promotions``), so the budget holds for the request whatever drafted it.

Everything is O(1) per step and a policy is a few Python numbers plus a bounded deque.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterator

from vllm_adaptivespec.config import AdaptiveSpecConfig


def tree_capacity(depth: int, width: int) -> int:
    """Nodes a level-by-level build creates: ``width`` children of the root, then ``width``
    children for each of the ``width`` frontier nodes on every further level."""
    if depth <= 0:
        return 0
    return width + (depth - 1) * width * width


@dataclass(frozen=True)
class TreeShape:
    """Shape of one sequence's draft tree for one step. depth 0 (nodes 0) means: no draft."""

    depth: int
    width: int
    nodes: int

    def __post_init__(self) -> None:
        if self.depth < 0 or self.width < 1:
            raise ValueError(f"TreeShape needs depth >= 0 and width >= 1 (got {self})")
        if not self.depth <= self.nodes <= tree_capacity(self.depth, self.width):
            raise ValueError(
                f"TreeShape needs depth <= nodes <= capacity {tree_capacity(self.depth, self.width)} (got {self})"
            )

    @property
    def is_chain(self) -> bool:
        return self.width == 1


def best_depth(signal: float, min_depth: int, max_depth: int, draft_cost: float) -> int:
    """Chain depth with the most expected tokens per unit of step cost (module docstring)."""
    signal = min(1.0, max(0.0, signal))
    best, best_rate = min_depth, -1.0
    expected, term = 1.0, 1.0
    for depth in range(1, max_depth + 1):
        term *= signal
        expected += term
        if depth >= min_depth:
            rate = expected / (1.0 + draft_cost * depth)
            if rate >= best_rate:
                best, best_rate = depth, rate
    return best


def clamped_confidence(confidence: float) -> float:
    """A drafter confidence as a chance in [0, 1] (NaN, from a degenerate softmax, reads as 0)."""
    return 0.0 if math.isnan(confidence) else min(1.0, max(0.0, float(confidence)))


def _ramp(signal: float, low: float, high: float) -> float:
    return min(1.0, max(0.0, (signal - low) / (high - low)))


class SequencePolicy:
    """Shape decisions and acceptance history for one request."""

    __slots__ = ("config", "_window", "_sum_accepted", "_sum_trials", "_sum_promoted", "_sum_agreed", "totals")

    def __init__(self, config: AdaptiveSpecConfig):
        self.config = config
        # One entry a verified step: (accepted, trials, promoted, agreed = accepted - promoted of this drafter).
        self._window: deque[tuple[int, int, int, int]] = deque(maxlen=config.history_window)
        self._sum_accepted = 0
        self._sum_trials = 0
        self._sum_promoted = 0
        self._sum_agreed = 0
        # Lifetime counters for metrics: steps, drafted, accepted, promoted.
        self.totals = [0, 0, 0, 0]

    @property
    def acceptance_rate(self) -> float:
        """Per-position acceptance over the window (``prior_acceptance`` before any judged position)."""
        if self._sum_trials == 0:
            return self.config.prior_acceptance
        return self._sum_accepted / self._sum_trials

    @property
    def agreement_rate(self) -> float:
        """Per-position strict acceptance over the window, promotions not counted (``prior_acceptance`` before any
        judged position): the lossy budget's floor."""
        if self._sum_trials == 0:
            return self.config.prior_acceptance
        return self._sum_agreed / self._sum_trials

    @property
    def judged(self) -> int:
        """Draft positions judged within the window (0: ``acceptance_rate`` is still the prior)."""
        return self._sum_trials

    def __len__(self) -> int:
        """Verified steps in the window."""
        return len(self._window)

    def signal(self, confidence: float) -> float:
        """Fused signal in [0, 1] from this step's drafter top-1 confidence and the history."""
        confidence = clamped_confidence(confidence)
        weight = self.config.confidence_weight
        return min(1.0, weight * confidence + (1.0 - weight) * self.acceptance_rate)

    def shape(
        self, confidence: float, batch_size: int = 1, node_cap: int | None = None, draft_cost: float | None = None
    ) -> TreeShape:
        """The draft tree shape for this step (``draft_cost``: a measured value in place of the config's)."""
        return self.shape_for_signal(self.signal(confidence), batch_size, node_cap, draft_cost)

    def shape_for_signal(
        self, signal: float, batch_size: int = 1, node_cap: int | None = None, draft_cost: float | None = None
    ) -> TreeShape:
        """The shape formula of the module docstring, for an already fused signal."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
        if node_cap is not None and node_cap < 1:
            raise ValueError(f"node_cap must be >= 1 or None (got {node_cap})")
        cfg = self.config
        depth = best_depth(signal, cfg.min_depth, cfg.max_depth, cfg.draft_cost if draft_cost is None else draft_cost)
        if cfg.mode == "chain":
            width = 1
        else:
            width_span = cfg.max_width - cfg.min_width
            width = cfg.max_width - min(
                width_span, math.floor(_ramp(signal, cfg.wide_below, cfg.narrow_above) * (width_span + 1))
            )
        cap = min(cfg.max_nodes, max(cfg.min_nodes, cfg.batch_node_budget // batch_size))
        if node_cap is not None:
            cap = min(cap, node_cap)
        depth = min(depth, cap)
        upper = min(cap, tree_capacity(depth, width))
        lower = min(max(depth, cfg.min_nodes), upper)
        nodes = min(max(depth * width, lower), upper)
        return TreeShape(depth, width, nodes)

    def observe(self, drafted: int, accepted: int, promoted: int) -> None:
        """Record one verified step: ``drafted`` = the tree's depth (most tokens that could be
        accepted), ``accepted`` = accepted draft tokens (promotions included), ``promoted`` = how
        many of those the margin rule promoted. A step with drafted == 0 is ignored."""
        if not 0 <= accepted <= drafted or not 0 <= promoted <= accepted:
            raise ValueError(
                f"observe needs 0 <= promoted <= accepted <= drafted (got {drafted=}, {accepted=}, {promoted=})"
            )
        if drafted == 0:
            return
        trials = accepted + (1 if accepted < drafted else 0)
        self._push(accepted, trials, promoted, accepted - promoted)
        totals = self.totals
        totals[0] += 1
        totals[1] += drafted
        totals[2] += accepted
        totals[3] += promoted

    def observe_promotions(self, promoted: int) -> None:
        """Record a verified step drafted by another source: its ``promoted`` margin promotions count toward
        the lossy budget; its acceptance is that source's, not this history's."""
        if promoted < 0:
            raise ValueError(f"observe_promotions needs promoted >= 0 (got {promoted=})")
        self._push(0, 0, promoted, 0)

    def _push(self, accepted: int, trials: int, promoted: int, agreed: int) -> None:
        if len(self._window) == self._window.maxlen:
            old_accepted, old_trials, old_promoted, old_agreed = self._window[0]
            self._sum_accepted -= old_accepted
            self._sum_trials -= old_trials
            self._sum_promoted -= old_promoted
            self._sum_agreed -= old_agreed
        self._window.append((accepted, trials, promoted, agreed))
        self._sum_accepted += accepted
        self._sum_trials += trials
        self._sum_promoted += promoted
        self._sum_agreed += agreed

    def promotion_allowance(self, tau: float | None = None) -> int:
        """Margin promotions the next step may use (see the lossy budget in the module docstring);
        ``tau`` is the request's own threshold when it overrides the configured one."""
        cfg = self.config
        lossless = (cfg.tau if tau is None else tau) >= 1.0
        if lossless or self.agreement_rate < cfg.promotion_min_acceptance:
            return 0
        recent = self._sum_promoted
        if len(self._window) == self._window.maxlen:
            recent -= self._window[0][2]  # that step leaves the window when the next one enters
        return max(0, min(cfg.max_promotions_per_step, cfg.max_promotions_per_window - recent))


class PolicyBank:
    """One SequencePolicy per live request, created on first use and dropped by ``free``."""

    def __init__(self, config: AdaptiveSpecConfig):
        self.config = config
        self._policies: dict[str, SequencePolicy] = {}

    def __getitem__(self, req_id: str) -> SequencePolicy:
        policy = self._policies.get(req_id)
        if policy is None:
            policy = self._policies[req_id] = SequencePolicy(self.config)
        return policy

    def get(self, req_id: str, config: AdaptiveSpecConfig | None = None) -> SequencePolicy:
        """The request's policy; created with ``config`` (a per-request override) if new."""
        policy = self._policies.get(req_id)
        if policy is None:
            policy = self._policies[req_id] = SequencePolicy(config or self.config)
        return policy

    def free(self, req_id: str) -> None:
        self._policies.pop(req_id, None)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._policies

    def __len__(self) -> int:
        return len(self._policies)

    def __iter__(self) -> Iterator[str]:
        return iter(self._policies)
