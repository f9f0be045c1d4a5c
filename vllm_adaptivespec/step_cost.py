"""Batch-level step plan: how many drafter passes a step runs and how many draft tokens each request
verifies, priced by a step-cost model fitted online on the hardware at hand.

Cost model (``StepCosts``), every term measured by the engine every step:

    t_target(q)  target forward over q query tokens: per power-of-two bucket of q the median of its
                 recent times, at the median size they were read at, fitted non-decreasing across
                 buckets (``BucketedTime``), linear in
                 between, flat below the smallest bucket, proportional to q above the largest
                 (compute bound there); needs two buckets
    t_pass(r)    one drafter pass over r rows, bucketed the same way, but proportional below the smallest
                 measured bucket: the first pass a drafter is timed on is often one over prompts (hundreds
                 of rows), and reading a B-row pass as that dear would keep it off without ever timing
                 it; the optimistic reading lets the plan try it once, and the try measures it
    t_fixed      the rest of a step that verifies no draft (scheduling, sampling, output processing): the
                 step's wall-clock minus its target forward and its drafter passes, median of the recent
                 such steps
    t_verify     what a step that verifies drafts costs beyond t_fixed: vLLM's rejection sampler in place of
                 its plain sampler, the verdicts' bookkeeping; the median rest of the recent verifying steps
                 less t_fixed, at least 0, and 0 until both kinds of step are measured (sampling through the
                 rejection sampler took 3.1 ms a step at batch 8 on 2 CPU cores, plain sampling 0.8; there the
                 two kinds of rest came out equal, a drafter-off step paying for its own plan instead)

A step with B requests, request i verifying d_i draft tokens (0 = no speculation for it), costs

    t(d) = t_fixed + [sum_i d_i > 0] t_verify + t_target(B + sum_i d_i) + drafter(d),    D = max_i d_i
    drafter(d) = 0                                  when D = 0: no drafter pass at all
               = t_pass(E(d)) + (D - 1) t_pass(B)   otherwise

A step that drafts runs a first pass over the tokens the step before it emitted (the drafter's KV for
them; it drafts level 1), then D - 1 passes over its B rows. Each plan is charged the first pass its own
emitted tokens E(d) cause at the next step, not the one this step ran over the last step's: that one is
paid whatever this step chooses, and a cost every plan shares, left in a ratio, favours the dearer plans
(at batch 32 a deep plan then looked nearly free, while the first pass over its 128 emitted tokens cost
as much as the target's forward). The same t(d) prices the plan before the first pass (does this step
run the drafter at all?) and after it (how deep?).

and emits, with p_i the request's per-position acceptance estimate (a chance, calibrated),

    E(d) = B + sum_i (p_i + p_i^2 + ... + p_i^d_i)

``plan_depths`` returns the d maximising E(d) / t(d), searched exactly for unconstrained depths:
for each D in 0..max_depth, the best d with max d_i <= D takes the N largest marginal gains p_i^k
(k <= D) for some N: t depends on d only through sum d_i = N, D and E(d), the N largest gains give
the largest E for that N (p_i^k falls with k, so they are a prefix of each request's chain), and a
larger E raises E / t as long as one more row of a drafter pass costs less than the step's average
seconds per emitted token, t / E (a pass's rows share one read of the drafter's weights); all N are
tried. Then the user's
floor applies: a request that drafts drafts at least ``min_depth`` (raised, not dropped), and with
``allow_off`` false every request drafts at least ``min_depth``. A plan must beat the next smaller D
by ``MIN_GAIN`` to be chosen, so equal rates keep the cheaper step, and any speculation must beat plain
decoding by ``MIN_GAIN_OVER_PLAIN``: the fitted prices err by about that much, and a wrong "on" costs more
than a wrong "off" gives up (at batch 8 on 2 cores the plan priced plain decoding's step at 154 ms where it
ran 139 ms, and a depth-1 plan it priced at break-even ran 14% slower than plain decoding).

Free drafts (``free``: per request a draft of L_i tokens copied from its own text, whose first token is
accepted with chance f_i and every later one with chance c_i given the one before it, so its k-th with
chance f_i c_i^(k - 1) (a copy fails at its start or runs: ``engine/free_draft.py``); L_i = 0: none) cost
verification but no drafter pass. With them a request drafts from one source, and only the requests
drafting from the drafter count towards D:

    y_i      = f_i (1 + c_i + ... + c_i^(L_i - 1))         expected accepted tokens of the whole free chain
    source_i = free     when L_i > 0 and (D = 0 or y_i >= p_i + ... + p_i^D): its whole free chain is
                        expected to yield at least the drafter's and needs no pass
             = drafter  otherwise
    gains of request i: f_i c_i^(k - 1) for k <= L_i (free), p_i^k for k <= D (drafter)

and the same N-largest search runs over those gains (a free chain's still fall with k, as c_i <= 1), for
D = 0 (free drafts only, no pass) through max_depth; for each D >= 1 it also runs with every request on
the drafter (source_i = drafter for all), since the rule weighs whole chains and not what verifying them
costs (a long, unsure copy can lose to one sure drafter token). The source rule is a choice, not a search
(a free chain less sure than the drafter's that would save a pass for the whole batch is only found at D = 0),
so with free drafts the plan is at least the optimum among plans that follow the rule (tested against
brute force, and against the best of all plans in random batches of up to 3 requests).
``min_depth`` raises drafter chains only (a free chain is as long as its match allows).

Speculation off (``max(d) == 0`` before the first pass) means the step runs no drafter pass at all; the
tokens it emits wait for the drafter's catch-up at its next pass. That catch-up is what turning the drafter
back on costs beyond a step that drafts anyway: its first pass runs over R rows, every token the drafter
missed (a prompt whose prefill skipped it included) and the last step's, where a drafting batch's first pass
runs over about B. It is paid once and repays over the T tokens the batch emits while the drafter stays on:
what the batch is expected to emit from here (``OutputLengths``), but no more than the drafter's recent stretches
on lasted (``Stretches``: a turn-on priced on estimates from before its first pass is a bet that the pass then
confirms; at batch 8 on 2 CPU cores it lasted five steps and paid a 7 s catch-up for them), so before the first
pass a plan that drafts is charged it per emitted token:

    catch_up   = max(0, t_pass(R) - t_pass(B)) / T          seconds per emitted token
    drafter(d) = catch_up * E(d) + t_pass(E(d)) + (D - 1) t_pass(B)     when D > 0

(E / (a + catch_up E) still rises with E, so the N-largest search stays exact.) Charged for one step only,
the backlog would keep a batch off for good once it had been off a while (the backlog grows with every
step off); never charged, a batch at 2 CPU cores turned a drafter that did not pay back on every few steps,
each time for a catch-up pass over hundreds to thousands of rows (1.5-6 s a step, where a plain step took
0.5 s). After the first pass (how deep?) the catch-up is paid and ``catch_up`` is 0.
Whether looking again can ever pay (``could_pay``) is the same plan with every p_i = 1, catch-up and the
step's free drafts included, with T not capped by the stretches (a drafter that is always right is never
turned off, so its stretch lasts as long as the batch has tokens ahead): when even such a drafter loses to
plain decoding, or to the copies on offer, at this batch size on these costs, no acceptance estimate can
change the answer, and a probe (which pays the drafter's catch-up) buys nothing. (Edit workload, batch 1:
without the copies in it, a request whose 8-token copies were accepted whole step after step was probed
every 16 steps, each probe a first pass over the 150-410 tokens the drafter had missed, 0.4-0.95 s, beside
steps of 0.2 s.)

Re-planned after every drafter pass (``continue_chains``, chains): after j passes request i's chain holds j
drafted tokens, each with its own fused estimate p_i,k (from that token's confidence, as p_i is from the first
token's), so the chance that its first k tokens are all accepted is known, and the tokens not drafted yet are
priced at the latest token's estimate:

    g_i,k = p_i,1 p_i,2 ... p_i,k              k <= j    (drafted)
          = g_i,j p_i,j^(k - j)                k > j     (one more pass each)

The step's choice is then D in j..max_depth and each chain's length (d_i <= D), by the same N-largest search
over these gains (each request's still fall with k), with drafter(d) = t_pass(E(d)) + (max(D, j) - 1) t_pass(B):
the j passes run stay in the ratio (sunk, but a cost all choices share still changes a ratio's argmax). D = j
stops drafting; D > j runs one more pass and plans again with that pass's token known. A deeper D must beat
the best shallower one by ``MIN_GAIN``. Copies (free drafts) are fixed by then: their expected tokens and query
tokens are added to every choice. So a chain whose second token the drafter doubts stops there, and one it
keeps being sure of goes on past the first plan's depth, where the first plan priced every later token at the
first one's estimate.

A request's acceptance history is shrunk toward the engine's pooled acceptance (``PooledAcceptance``: the
same per-position rate over the last judged drafts of every request) while it holds few judged positions
(``AdaptiveState._history``): a new request starts from the pool, so a drafter that has not been paying is not
trusted afresh for every new request, and one rejected token does not make a request's drafter look hopeless.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.policy import SequencePolicy, clamped_confidence

MIN_GAIN = 0.01  # a deeper plan must be at least 1% faster than the best shallower one
MIN_GAIN_OVER_PLAIN = 0.05  # and any speculation 5% faster than plain decoding (the prices' error)


def monotone_fit(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (isotonic regression,
    pool adjacent violators): a run of values that decreases is replaced by its weighted mean.

    Worked example: values [1.0, 3.0, 2.0, 4.0], weights [1, 1, 1, 1] -> [1.0, 2.5, 2.5, 4.0]."""
    blocks: list[list[float]] = []  # [mean, weight, length] of each pooled run
    for value, weight in zip(values, weights):
        blocks.append([float(value), float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight, length = blocks.pop()
            last = blocks[-1]
            last[0] = (last[0] * last[1] + mean * weight) / (last[1] + weight)
            last[1] += weight
            last[2] += length
    return [mean for mean, _, length in blocks for _ in range(int(length))]


class BucketedTime:
    """Seconds of an operation as a function of its size, fitted so that a noisy machine cannot make
    more work look cheaper:

        m_b     median of the last ``window`` observations whose size falls in power-of-two bucket b
                (sizes in (b/2, b]); a stall of the machine moves a median less than a mean
        x_b     median of those observations' sizes: where in its bucket m_b was read
        f_b     the non-decreasing fit of m_b over the measured buckets (``monotone_fit``, each bucket
                weighted by its number of observations): a forward over more tokens never takes less
                time, so a bucket measured slow among few samples is pooled with its neighbours
        t(q)    f linear between the points (x_b, f_b), flat below the smallest (or, with
                ``proportional_below``, proportional to q there too), proportional to q above the largest

    A bucket's time is placed at the sizes it was read at, not at the bucket's top b: at batch 32, steps of
    160-224 query tokens (depth 4-6) read 0.93 s into bucket 256, and placed at 256 the fit priced a
    192-token forward at 0.67 s, so deep plans looked 30% cheaper than they ran (1.58 s steps priced 1.24 s)
    and the plan drafted 5 deep at 0.73x plain decoding.

    Old readings go stale: a bucket whose last observation is more than ``stale_after`` observations
    (of any size) ago is left out of the fit where fresh buckets lie on both sides of it (t is
    interpolated over it), and its next observation restarts it instead of joining readings from another
    phase of the run.
    Otherwise a plan avoids a size it once measured dear for good: at batch 32, plain decoding's 32-token
    forward read 0.32 s at the start of a run, was never run again while the plan drafted 8 deep on that
    reading, and the same forward took 0.21 s in a run that decoded plainly. ``age`` says how stale a size's
    bucket is, so the engine can re-measure the one it compares every plan against (``AdaptiveState``'s
    cost probe).
    """

    def __init__(self, window: int = 32, proportional_below: bool = False, stale_after: int | None = None):
        self.window = window
        self.proportional_below = proportional_below
        self.stale_after = 4 * window if stale_after is None else stale_after
        self._observed: dict[int, deque[tuple[int, float]]] = {}  # bucket -> its last ``window`` (size, seconds)
        self._last: dict[int, int] = {}  # bucket -> ``clock`` at its last observation
        self.clock = 0  # observations so far, of any size
        self._fitted: tuple[np.ndarray, np.ndarray] | None = None  # (x_b, f_b), None when stale

    @staticmethod
    def bucket(size: int) -> int:
        return 1 << max(0, math.ceil(math.log2(max(1, size))))

    def observe(self, size: int, seconds: float) -> None:
        if size < 1 or not seconds > 0:
            return
        key = self.bucket(size)
        self.clock += 1
        readings = self._observed.setdefault(key, deque(maxlen=self.window))
        if self.clock - self._last.get(key, self.clock) > self.stale_after:
            readings.clear()  # a stale bucket restarts
        readings.append((size, seconds))
        self._last[key] = self.clock
        self._fitted = None

    def age(self, size: int) -> int | None:
        """Observations since ``size``'s bucket was last observed (0: the latest was one); None if never."""
        last = self._last.get(self.bucket(size))
        return None if last is None else self.clock - last

    def points(self) -> int:
        return len(self._observed)

    def fitted(self) -> dict[int, float]:
        """{x_b: f_b} (x_b rounded to a whole size), stale buckets between fresh ones left out."""
        xs, ys = self._fit()
        return {int(round(x)): float(y) for x, y in zip(xs, ys)}

    def _fit(self) -> tuple[np.ndarray, np.ndarray]:
        """(x_b, f_b) of ``fitted``, refitted only after a new observation."""
        if self._fitted is None:
            buckets = sorted(self._observed)
            fresh = [b for b in buckets if self.clock - self._last[b] <= self.stale_after]
            if len(fresh) >= 2:
                buckets = [b for b in buckets if b in fresh or not fresh[0] < b < fresh[-1]]
            readings = [np.asarray(self._observed[b], dtype=np.float64) for b in buckets]  # [n_b, 2] (size, s)
            sizes = [float(np.median(r[:, 0])) for r in readings]  # x_b, increasing: buckets are disjoint
            medians = [float(np.median(r[:, 1])) for r in readings]
            counts = [len(r) for r in readings]
            self._fitted = (np.array(sizes, dtype=np.float64), np.array(monotone_fit(medians, counts)))
        return self._fitted

    def seconds(self, size: int | np.ndarray, min_points: int = 2):
        """Estimated seconds for ``size`` (an int or an array of them), t(q) of the class docstring;
        None with fewer than ``min_points`` buckets measured (one bucket: flat, but proportional below it
        with ``proportional_below``)."""
        if len(self._observed) < max(1, min_points):
            return None
        xs, ys = self._fit()
        q = np.maximum(1.0, np.asarray(size, dtype=np.float64))
        out = np.interp(q, xs, ys)
        if len(xs) > 1:
            out = np.where(q > xs[-1], ys[-1] * q / xs[-1], out)
        if self.proportional_below:
            out = np.where(q < xs[0], ys[0] * q / xs[0], out)
        return float(out) if np.ndim(out) == 0 else out


class StepCosts:
    """The fitted step-cost model of the module docstring (t_fixed and t_verify from the medians of the last
    ``window`` remainders of each kind of step, as the buckets are)."""

    def __init__(self, window: int = 32, target: BucketedTime | None = None):
        self.target = target if target is not None else BucketedTime(window)  # by query tokens of the forward
        self.draft_pass = BucketedTime(window, proportional_below=True)  # by rows of the pass
        self._rests: deque[float] = deque(maxlen=window)  # steps that verified no draft
        self._verify_rests: deque[float] = deque(maxlen=window)  # steps that verified drafts

    @property
    def fixed(self) -> float | None:
        """t_fixed; while no step without drafts is measured, the verifying steps' rest (t_verify 0)."""
        rests = self._rests or self._verify_rests
        return float(np.median(rests)) if rests else None

    @fixed.setter
    def fixed(self, seconds: float) -> None:
        """Set t_fixed (t_verify 0)."""
        self._rests.clear()
        self._verify_rests.clear()
        self._rests.append(seconds)

    @property
    def verify(self) -> float:
        """t_verify (module docstring)."""
        if not self._rests or not self._verify_rests:
            return 0.0
        return max(0.0, float(np.median(self._verify_rests)) - float(np.median(self._rests)))

    def observe_step(self, seconds: float, target_seconds: float, draft_seconds: float, verified: bool) -> None:
        """One whole step took ``seconds``, of which the target forward and the drafter passes took
        the other two; the rest is the fixed cost of a step that ``verified`` drafts or of one that did not
        (a step much longer than its parts, e.g. an idle wait for requests, is not a step's cost and is
        ignored)."""
        rest = seconds - target_seconds - draft_seconds
        if rest < 0 or seconds > 3.0 * (target_seconds + draft_seconds) + 0.05:
            return
        (self._verify_rests if verified else self._rests).append(rest)

    def snapshot(self) -> dict:
        """The fitted model as plain numbers: {"target": {bucket: s}, "draft_pass": {bucket: s}, "fixed": s,
        "verify": s}."""
        return {"target": self.target.fitted(), "draft_pass": self.draft_pass.fitted(), "fixed": self.fixed,
                "verify": self.verify}

    @classmethod
    def from_snapshot(cls, snapshot: dict) -> StepCosts:
        costs = cls()
        for key, seconds in snapshot["target"].items():
            costs.target.observe(int(key), float(seconds))
        for key, seconds in snapshot["draft_pass"].items():
            costs.draft_pass.observe(int(key), float(seconds))
        if snapshot["fixed"] is not None:
            costs.fixed = snapshot["fixed"]
            if snapshot.get("verify"):  # absent from snapshots saved before t_verify was measured
                costs._verify_rests.append(snapshot["fixed"] + snapshot["verify"])
        return costs

    def ready(self) -> bool:
        """Enough is measured to plan: two target buckets and one drafter bucket."""
        return self.target.points() >= 2 and self.draft_pass.points() >= 1


@dataclass(frozen=True)
class StepPlan:
    depths: list[int]  # d_i per request
    rate: float  # expected tokens per second of the plan
    plain_rate: float  # expected tokens per second without speculation
    free: list[bool] | None = None  # per request: its d_i tokens come from its free draft (None: no free drafts)

    @property
    def passes(self) -> int:
        """The deepest chain drawn from the drafter (free chains need no pass)."""
        free = self.free or [False] * len(self.depths)
        return max((d for d, f in zip(self.depths, free) if not f), default=0)


class _Candidate(NamedTuple):
    """One search of ``plan_depths``: a source per request and its gains, best first."""

    use_free: np.ndarray  # [B] bool: source_i = free
    order: np.ndarray  # [sum(cap)] indices into the [B, width] gains, largest first
    width: int  # longest chain of the search
    total: np.ndarray  # [sum(cap)] E for N = 1..sum(cap)
    passes: int  # D: drafter passes the search's plans run (0: free drafts only)


def plan_depths(
    acceptance: Sequence[float],
    costs: StepCosts,
    min_depth: int,
    max_depth: int,
    allow_off: bool = True,
    free: Sequence[tuple[int, float, float]] | None = None,
    catch_up: float = 0.0,
) -> StepPlan | None:
    """The plan of the module docstring for requests with per-position acceptance ``acceptance`` and,
    optionally, free drafts ``free`` ((L_i, f_i, c_i) per request) and the drafter's catch-up ``catch_up``
    (seconds per emitted token, ``catch_up_per_token``). None while the cost model is not ready."""
    if not costs.ready() or not acceptance:
        return None
    p = np.clip(np.asarray(acceptance, dtype=np.float64), 0.0, 1.0)  # [B]
    batch = p.shape[0]
    if free is None:
        free_len, first, cont = np.zeros(batch, dtype=np.int64), np.zeros(batch), np.zeros(batch)
    else:
        free_len = np.asarray([n for n, _, _ in free], dtype=np.int64)  # [B] L_i
        first = np.clip(np.asarray([f for _, f, _ in free], dtype=np.float64), 0.0, 1.0)  # [B] f_i
        cont = np.clip(np.asarray([c for _, _, c in free], dtype=np.float64), 0.0, 1.0)  # [B] c_i
    has_free = free_len > 0
    free_yield = copy_yield(first, cont, free_len)  # [B] y_i
    drafter_yields = np.cumsum(p[:, None] ** np.arange(1, max_depth + 1)[None, :], axis=1)  # [B, max_depth]
    fixed = costs.fixed or 0.0
    plain_rate = batch / (fixed + costs.target.seconds(batch))
    searches = [(depth, True) for depth in range(0 if has_free.any() else 1, max_depth + 1)]
    if has_free.any():  # the same depths with every request on the drafter
        searches += [(depth, False) for depth in range(1, max_depth + 1)]
    candidates: list[_Candidate] = []
    for depth, rule in searches:
        drafter_yield = drafter_yields[:, depth - 1] if depth > 0 else 0.0
        use_free = has_free & rule & ((depth == 0) | (free_yield >= drafter_yield))  # [B] source_i = free
        cap = np.where(use_free, free_len, depth)  # [B] longest chain of the request's source
        width = int(cap.max(initial=0))
        if width == 0:
            continue
        k = np.arange(1, width + 1)[None, :]
        gains = np.where(use_free[:, None], first[:, None] * cont[:, None] ** (k - 1), p[:, None] ** k)  # [B, K]
        gains = np.where(k <= cap[:, None], gains, -1.0).reshape(-1)  # beyond a chain: never taken
        order = np.argsort(-gains, kind="stable")[: int(cap.sum())]
        total = batch + np.cumsum(gains[order])  # E for N = 1..sum(cap)
        passes = depth if (~use_free & (cap > 0)).any() else 0  # D: free chains need no pass
        candidates.append(_Candidate(use_free, order, width, total, passes))
    # t(d) of every candidate at once: one lookup per fitted curve, not three per search (the plan runs every step).
    totals = np.concatenate([np.zeros(0)] + [c.total for c in candidates])  # E
    sizes = np.concatenate([np.zeros(0)] + [batch + np.arange(1, c.total.shape[0] + 1) for c in candidates])  # B + N
    passes = np.concatenate([np.zeros(0)] + [np.full(c.total.shape[0], c.passes) for c in candidates])  # D
    all_rates = totals / (
        fixed + costs.verify + costs.target.seconds(sizes) + _drafter_seconds(costs, batch, totals, passes, catch_up)
    )
    best_depths, best_rate = np.zeros(batch, dtype=np.int64), plain_rate
    best_free = np.zeros(batch, dtype=bool)
    start = 0
    for c in candidates:
        rates = all_rates[start : start + c.total.shape[0]]  # this search's E / t for N = 1..sum(cap)
        start += c.total.shape[0]
        pick = int(np.argmax(rates))
        speculating = bool(best_depths.any())
        if rates[pick] > best_rate * (1.0 + (MIN_GAIN if speculating else MIN_GAIN_OVER_PLAIN)):
            best_rate = float(rates[pick])
            best_depths = np.bincount(c.order[: pick + 1] // c.width, minlength=batch)
            best_free = c.use_free & (best_depths > 0)
    depths = best_depths
    if not allow_off:
        depths = np.where(best_free, depths, np.maximum(depths, min_depth))
    depths = np.where(~best_free & (depths > 0) & (depths < min_depth), min_depth, depths)
    depths = np.minimum(depths, max_depth)
    return StepPlan([int(d) for d in depths], best_rate, plain_rate, None if free is None else best_free.tolist())


def _drafter_seconds(costs: StepCosts, batch: int, emitted, passes, catch_up: float = 0.0):
    """drafter(d) of the module docstring for a step of ``batch`` requests that emits ``emitted`` tokens
    and drafts ``passes`` = D levels from the drafter (either may be an array: elementwise):
    catch_up * emitted + t_pass(emitted) + (D - 1) t_pass(B), 0 when D = 0."""
    passes = np.asarray(passes)
    first = costs.draft_pass.seconds(emitted, min_points=1)  # next step's first pass, over the emitted tokens
    seconds = catch_up * emitted + first + (passes - 1) * costs.draft_pass.seconds(batch, min_points=1)
    return np.where(passes > 0, seconds, 0.0)


def continue_chains(
    drafted: Sequence[Sequence[float]],
    passes_run: int,
    costs: StepCosts,
    max_depth: int,
    copies: tuple[float, int] = (0.0, 0),
) -> Continuation | None:
    """``continue_chains`` of the module docstring after ``passes_run`` = j drafter passes: ``drafted[i]`` holds
    request i's fused estimates p_i,1..p_i,j of its drafted tokens (empty: it drafts nothing from the drafter
    this step); ``copies`` = (expected accepted tokens, query tokens) of the step's free drafts. Returns the
    chosen lengths d_i and D (= j: stop); None while the cost model is not ready."""
    if not costs.ready() or not drafted:
        return None
    batch = len(drafted)
    j = passes_run
    top = max(j, max_depth)
    gains = np.full((batch, top), -1.0)  # [B, K] g_i,k; -1: never taken
    for i, estimates in enumerate(drafted):
        if not estimates:
            continue
        p = np.clip(np.asarray(estimates[:j], dtype=np.float64), 0.0, 1.0)
        survival = np.cumprod(p)  # [j] g_i,1..g_i,j
        gains[i, :j] = survival
        gains[i, j:] = survival[-1] * p[-1] ** np.arange(1, top - j + 1)
    copy_gain, copy_tokens = copies
    fixed = (costs.fixed or 0.0) + costs.verify  # the step verifies its drafts
    best = None
    for depth in range(j, top + 1):
        cap = np.where(gains[:, 0] >= 0, depth, 0)  # [B]
        k = np.arange(1, top + 1)[None, :]
        flat = np.where(k <= cap[:, None], gains, -1.0).reshape(-1)
        order = np.argsort(-flat, kind="stable")[: int(cap.sum())]
        total = batch + copy_gain + np.concatenate([[0.0], np.cumsum(flat[order])])  # E for N = 0..sum(cap)
        n = np.arange(order.shape[0] + 1)
        drafter = _drafter_seconds(costs, batch, total, max(depth, 1))
        rates = total / (fixed + costs.target.seconds(batch + copy_tokens + n) + drafter)
        pick = int(np.argmax(rates))
        if best is None or rates[pick] > best[0] * (1.0 + MIN_GAIN):
            best = (float(rates[pick]), depth, np.bincount(order[:pick] // top, minlength=batch))
    rate, depth, lengths = best
    return Continuation([int(d) for d in lengths], depth, rate)


@dataclass(frozen=True)
class Continuation:
    lengths: list[int]  # d_i per request (at most ``passes``)
    passes: int  # D: drafter passes the step runs in all (= the passes run so far: stop now)
    rate: float  # expected tokens per second of that choice


def catch_up_per_token(costs: StepCosts, batch: int, rows: int, tokens_ahead: float | None) -> float:
    """``catch_up`` of the module docstring: max(0, t_pass(R) - t_pass(B)) / T for a first pass over
    ``rows`` = R rows in a batch of B, the batch expected to emit ``tokens_ahead`` = T more tokens (at least
    one). 0 while no drafter pass is timed or T is unknown (None)."""
    if tokens_ahead is None or rows <= batch or costs.draft_pass.points() == 0:
        return 0.0
    extra = costs.draft_pass.seconds(rows, min_points=1) - costs.draft_pass.seconds(batch, min_points=1)
    return max(0.0, float(extra)) / max(1.0, tokens_ahead)


def copy_yield(first, cont, length):
    """f_i (1 + c_i + ... + c_i^(length_i - 1)), the expected accepted tokens of a free chain of ``length``
    tokens (arrays [B], or three numbers); 0 where the length is 0.

    Worked example: f = 0.8, c = 0.9, length 3 -> 0.8 + 0.72 + 0.648 = 2.168."""
    first, cont, length = np.asarray(first, dtype=np.float64), np.asarray(cont, dtype=np.float64), np.asarray(length)
    k = np.arange(int(length.max(initial=0)))  # [K] exponents 0..K-1
    terms = first[..., None] * cont[..., None] ** k  # [..., K]
    out = np.where(k < length[..., None], terms, 0.0).sum(-1)
    return float(out) if np.ndim(out) == 0 else out


def could_pay(
    costs: StepCosts,
    batch: int,
    max_depth: int,
    catch_up: float = 0.0,
    free: Sequence[tuple[int, float, float]] | None = None,
) -> bool:
    """Whether the drafter could beat the step's best plan without it for ``batch`` requests on ``costs``
    after a catch-up of ``catch_up`` seconds per emitted token: the plan with every acceptance estimate 1 (a
    drafter that is never wrong) runs a drafter pass. The plan without it is plain decoding, or with free
    drafts ``free`` ((L_i, f_i, c_i) per request, as ``plan_depths``) those copies. True while the cost model
    is not ready (nothing rules looking out yet)."""
    plan = plan_depths([1.0] * batch, costs, 1, max_depth, catch_up=catch_up, free=free)
    return plan is None or plan.passes > 0


class Stretches:
    """How long the drafter stays on once the plan turns it on: the tokens of the last ``window`` stretches of
    steps that ran it, each started by the plan (a probe's step does not start one) and ended by an off step
    of the plan on the merits (a step off only to re-measure plain decoding does not end one), counted at B
    tokens a step (what a step emits at least). ``mean()``: their mean, None before ``min_stretches`` ended (one
    stretch is no estimate: the first, on a pooled acceptance read from one or two drafts, often lasts a step).

    A stretch the plan ends only because of a new backlog (off with the catch-up charged, on without it: a new
    request's prompt, at batch 1 every request's) is dropped, not recorded: it says nothing about how long the
    drafter keeps paying, and recorded it would feed itself. At batch 1 on 2 CPU cores (HumanEval, 88% of
    drafted tokens accepted) the first stretch lasted one step, so the next prompt's catch-up was priced over
    one token and the drafter stayed off, each such stretch shorter than the last: off at 419 of 770 decisions,
    0.84x stock k=4."""

    def __init__(self, window: int = 16, min_stretches: int = 3):
        self._done: deque[int] = deque(maxlen=window)
        self._current = 0  # tokens of the stretch under way (0: none)
        self.min_stretches = min_stretches

    def step(self, drafter: bool, batch: int, started_by_plan: bool, on_merits: bool = True) -> None:
        """One step ran the drafter (``drafter``) or not, for ``batch`` requests; ``on_merits`` false: off only
        for the catch-up (the stretch is dropped)."""
        if drafter and (self._current or started_by_plan):
            self._current += batch
        elif not drafter and self._current:
            if on_merits:
                self._done.append(self._current)
            self._current = 0

    def mean(self) -> float | None:
        return float(np.mean(self._done)) if len(self._done) >= self.min_stretches else None


class OutputLengths:
    """How many more tokens a running request is expected to emit, from the output lengths of the last
    ``window`` requests that finished (T of the module docstring is the sum over the batch):

        ahead(n, m) = mean of (L - n) over the recent lengths L > n, at most m - n
                    = m - n      when no recent length exceeds n (nothing says it ends sooner)

    n: the request's output so far; m: the most it may emit (its max_tokens, or what its context leaves)."""

    def __init__(self, window: int = 64):
        self._lengths: deque[int] = deque(maxlen=window)

    def observe(self, length: int) -> None:
        self._lengths.append(length)

    def ahead(self, n: int, m: int) -> float:
        longer = [length - n for length in self._lengths if length > n]
        return float(max(0, m - n)) if not longer else min(float(np.mean(longer)), float(max(0, m - n)))


class PooledAcceptance:
    """The per-position acceptance of recent drafts over every request (the engine's view of its drafter):

        a_pool = sum(accepted_j) / sum(trials_j)     over the last ``window`` judged drafts j

    counted as ``policy.SequencePolicy`` counts a request's drafts (it is one, over every request's);
    None before any draft was judged."""

    def __init__(self, window: int = 64):
        self._history = SequencePolicy(AdaptiveSpecConfig(history_window=window))

    def observe(self, drafted: int, accepted: int) -> None:
        self._history.observe(drafted, accepted, 0)

    def rate(self) -> float | None:
        return self._history.acceptance_rate if self._history.judged else None

    @property
    def judged(self) -> int:
        """Judged positions in the window (what ``rate`` is over)."""
        return self._history.judged

    def __len__(self) -> int:
        """Drafts in the window."""
        return len(self._history)


def shrunk_rate(judged: int, rate: float | None, prior: float, weight: float) -> float:
    """An observed rate over ``judged`` trials shrunk toward ``prior``, counted as ``weight`` trials:
    (judged * rate + weight * prior) / (judged + weight); the prior alone before any trial (``rate`` None).

    Worked example: 2 trials at 1.0, prior 0.6 at weight 8 -> (2 + 4.8) / 10 = 0.68."""
    if not judged or rate is None:
        return prior
    return (judged * rate + weight * prior) / (judged + weight)


class ShrunkAcceptance:
    """The observed acceptance of a draft's first token per bin, shrunk toward a prior while the bin has
    few observations:

        rate(b, prior) = (accepted_b + prior_weight * prior) / (judged_b + prior_weight)"""

    def __init__(self, bins: int, prior_weight: float = 8.0):
        self.prior_weight = prior_weight
        self.judged = np.zeros(bins)
        self.accepted = np.zeros(bins)

    def observe(self, b: int, first_accepted: bool) -> None:
        self.judged[b] += 1
        self.accepted[b] += float(first_accepted)

    def rate(self, b: int, prior: float) -> float:
        return float((self.accepted[b] + self.prior_weight * prior) / (self.judged[b] + self.prior_weight))

    def mean(self) -> float | None:
        """The first-token acceptance over every bin, sum_b accepted_b / sum_b judged_b (None before any)."""
        judged = float(self.judged.sum())
        return float(self.accepted.sum()) / judged if judged else None


class ConfidenceCalibration(ShrunkAcceptance):
    """What the drafter's top-1 confidence is worth: ``ShrunkAcceptance`` over ``bins`` equal confidence
    bins, each shrunk toward the raw confidence:

        cal(c) = rate(bin(c), c)

    so a saturated confidence (~1 on code) is read as the acceptance it has actually earned."""

    def __init__(self, bins: int = 10, prior_weight: float = 8.0):
        super().__init__(bins, prior_weight)
        self.bins = bins

    def _bin(self, confidence: float) -> int:
        return min(self.bins - 1, int(confidence * self.bins))

    def observe(self, confidence: float, first_accepted: bool) -> None:
        super().observe(self._bin(clamped_confidence(confidence)), first_accepted)

    def __call__(self, confidence: float) -> float:
        c = clamped_confidence(confidence)
        return self.rate(self._bin(c), c)


def hindsight(records: list[dict], costs: StepCosts, max_depth: int) -> dict | None:
    """The policy's throughput against hindsight, all priced by the same fitted ``costs``.

    ``records``: one per verification step, ``{"drafted": [d_i], "accepted": [a_i], "passes": n}`` (n =
    drafter passes that produced the drafts; 0 = the step ran without the drafter). With hindsight a
    request whose draft was cut at a_i < d_i accepts exactly min(a_i, k) of any depth-k chain (the
    drafter's chain is the same prefix); one whose whole draft was accepted (a_i = d_i) is credited
    a_i for deeper chains too, a lower bound, since what lay beyond its draft is unknown.

        policy      sum_s (B + sum_i a_i) / sum_s (t_fixed + v_s + t_target(B + sum_i d_i) + drafter_s), where
                    drafter_s = t_pass(B + sum_i a_i) + (n_s - 1) t_pass(B) (0 when n_s = 0), the plan's
                    drafter(d) with its emitted tokens known, v_s = t_verify when the step verified drafts
        fixed k     every step drafts k for every request: B + S_k tokens, S_k = sum_i min(a_i, k), for
                    t_fixed + t_verify + t_target(B + B k) + t_pass(B + S_k) + (k - 1) t_pass(B) (k = 0: no
                    pass, no t_verify);
                    the best k over 0..max_depth
        oracle      every step chooses its depth cap D and how many of the sure tokens
                    G <= S_D to verify: B + G tokens for
                    t_fixed + [G > 0] t_verify + t_target(B + G) + t_pass(B + G) + (D - 1) t_pass(B) (no pass
                    when D = 0), each
                    step's choice maximising the run's tokens per second (Dinkelbach: tokens - lambda *
                    time per step, lambda iterated to the run's rate)
        regret      1 - policy / oracle

    Free drafts (copies, no drafter pass) are the policy's like any other draft, with the passes its steps
    actually ran; the fixed depths and the oracle know the drafter only, so where copies pay, the policy
    can beat them (negative regret).

    Returns {"policy", "best_fixed", "best_fixed_depth", "fixed", "oracle", "regret", "steps"}
    (rates in tokens per second), or None when there is nothing to judge."""
    if not records or not costs.ready():
        return None
    fixed, verify = costs.fixed or 0.0, costs.verify
    policy_tokens = policy_time = 0.0
    fixed_tokens = np.zeros(max_depth + 1)
    fixed_time = np.zeros(max_depth + 1)
    options = []  # per step: (tokens [m], time [m]) of the oracle's candidate choices
    depths = np.arange(max_depth + 1)
    for record in records:
        drafted = np.asarray(record["drafted"], dtype=np.int64)
        accepted = np.asarray(record["accepted"], dtype=np.int64)
        batch = drafted.shape[0]
        if batch == 0:
            continue
        emitted = batch + accepted.sum()
        policy_time += fixed + verify * (drafted.sum() > 0) + costs.target.seconds(batch + drafted.sum())
        policy_time += _drafter_seconds(costs, batch, emitted, record["passes"])
        policy_tokens += emitted
        sure = np.minimum(accepted[None, :], depths[:, None]).sum(1)  # [D+1] S_D, sure tokens at cap D
        fixed_tokens += batch + sure
        fixed_time += fixed + verify * (depths > 0) + costs.target.seconds(batch + batch * depths)
        fixed_time += _drafter_seconds(costs, batch, batch + sure, depths)
        tokens, time = [], []
        for cap in range(max_depth + 1):
            g = np.arange(sure[cap] + 1)
            tokens.append(batch + g)
            time.append(fixed + verify * (g > 0) + costs.target.seconds(batch + g)
                        + _drafter_seconds(costs, batch, batch + g, cap))
        options.append((np.concatenate(tokens), np.concatenate(time)))
    if policy_time <= 0:
        return None
    rate = policy_tokens / policy_time
    for _ in range(20):  # Dinkelbach iterations: converge in a few
        picks = [int(np.argmax(t - rate * s)) for t, s in options]
        total_tokens = sum(float(t[p]) for (t, _), p in zip(options, picks))
        total_time = sum(float(s[p]) for (_, s), p in zip(options, picks))
        new_rate = total_tokens / total_time
        if abs(new_rate - rate) <= 1e-12 * rate:
            break
        rate = new_rate
    fixed_rates = fixed_tokens / fixed_time
    best_k = int(np.argmax(fixed_rates))
    policy = policy_tokens / policy_time
    return {
        "policy": policy,
        "fixed": [float(r) for r in fixed_rates],
        "best_fixed": float(fixed_rates[best_k]),
        "best_fixed_depth": best_k,
        "oracle": rate,
        "regret": 1.0 - policy / rate,
        "steps": len(options),
    }
