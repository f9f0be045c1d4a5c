"""What drafting and verifying cost on the hardware at hand, measured online: the per-request node
cap verification cost implies (``VerifyCost``) and the drafter's cost per pass (``DraftCost``).

A target forward with q query tokens costs about as much as one with a single token while the
hardware is memory bound, then grows (2 CPU cores, Qwen2.5-1.5B: 1.0x, 1.0x, 1.3x, 1.5x, 2.1x for
q = 1, 4, 8, 16, 32). The runner times every target forward; times are kept per power-of-two bucket
of q (median of the recent ones, fitted non-decreasing: ``step_cost.BucketedTime``) and interpolated
linearly in between.

Node cap: with B requests each verifying n nodes, a step costs t(B (1 + n)) and yields per request
1 + E(n) tokens, where E(n) = a + a^2 + ... + a^n is the expected accepted length of n nodes at
per-position acceptance a (a chain's; a tree of n nodes does at least as well as its top-1 chain of
the same depth, and no better than n chain positions, so this keeps the estimate simple and
monotone). The cap is the n that maximises tokens per second, (1 + E(n)) / t(B (1 + n)): nodes are
free while the forward is memory bound, and must buy enough acceptance once they cost time. Until
two buckets are measured the cap is the ceiling (the policy alone decides).
"""

from __future__ import annotations

from vllm_adaptivespec.step_cost import BucketedTime


def smoothed(old: float | None, new: float, smoothing: float) -> float:
    """Exponential moving average step (the first observation is taken as is)."""
    return new if old is None else old + smoothing * (new - old)


class VerifyCost(BucketedTime):
    """Target forward time by query tokens (``BucketedTime``), and the node cap it implies."""

    def node_cap(self, batch_size: int, acceptance: float, ceiling: int) -> int:
        """Per-request draft nodes that maximise expected tokens per second (``ceiling`` at most)."""
        if ceiling <= 1 or self.seconds(batch_size) is None:
            return max(1, ceiling)
        a = min(max(acceptance, 0.0), 0.999)
        best, best_rate, expected = 1, -1.0, 0.0
        for n in range(1, ceiling + 1):
            expected += a**n
            rate = (1.0 + expected) / self.seconds(batch_size * (1 + n))
            if rate > best_rate * 1.001:  # a larger tree must be clearly faster
                best, best_rate = n, rate
        return best


class DraftCost:
    """One drafter pass's time relative to one target forward, the policy's ``draft_cost``.

    The drafter's cost depends on the pair and the hardware: a 0.5B draft model next to a 1.5B target
    takes about a third of a target step on 2 CPU cores, an EAGLE head on a GPU a few percent. Both
    times are smoothed (exponential moving average) over the steps just run, so the ratio follows
    batch size and context length as they change."""

    def __init__(self, smoothing: float = 0.2):
        self.smoothing = smoothing
        self._pass_seconds: float | None = None
        self._target_seconds: float | None = None

    def observe_draft(self, seconds: float, passes: int) -> None:
        """One propose call ran ``passes`` drafter forwards in ``seconds``."""
        if passes >= 1 and seconds > 0:
            self._pass_seconds = smoothed(self._pass_seconds, seconds / passes, self.smoothing)

    def observe_target(self, seconds: float) -> None:
        """One target forward took ``seconds``."""
        if seconds > 0:
            self._target_seconds = smoothed(self._target_seconds, seconds, self.smoothing)

    def ratio(self) -> float | None:
        """Drafter pass / target forward, None until both were timed."""
        if self._pass_seconds is None or self._target_seconds is None:
            return None
        return self._pass_seconds / self._target_seconds
