"""Batch step plan: against brute force over every depth vector, and the cost model's fitting."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_adaptivespec.step_cost import (
    MIN_GAIN,
    MIN_GAIN_OVER_PLAIN,
    BucketedTime,
    ConfidenceCalibration,
    OutputLengths,
    PooledAcceptance,
    StepCosts,
    Stretches,
    catch_up_per_token,
    continue_chains,
    copy_yield,
    could_pay,
    hindsight,
    monotone_fit,
    plan_depths,
)

FAST = settings(max_examples=300, deadline=None, derandomize=True)


def _costs(
    per_token: float, base: float, draft: float, fixed: float, draft_per_row: float = 0.0, verify: float = 0.0
) -> StepCosts:
    """Target forward base + per_token * q, measured at q = 1, 2, 4, ..., 64; drafter pass
    draft + draft_per_row * (r - 1), measured at r = 1 and (with ``draft_per_row``) 2, 4, ..., 64; a step's
    rest ``fixed`` without drafts, ``fixed + verify`` with."""
    costs = StepCosts(window=1)
    for q in (1, 2, 4, 8, 16, 32, 64):
        costs.target.observe(q, base + per_token * q)
        if q == 1 or draft_per_row:
            costs.draft_pass.observe(q, draft + draft_per_row * (q - 1))
    costs.fixed = fixed
    if verify:
        costs.observe_step(1.0 + fixed + verify, 1.0, 0.0, verified=True)
    assert costs.verify == pytest.approx(verify)
    return costs


def _drafter(costs, batch, emitted, deepest, catch_up=0.0):
    """drafter(d) of the module docstring: the catch-up charged per emitted token, the next first pass over
    the emitted tokens, then D - 1 over B."""
    if deepest == 0:
        return 0.0
    return catch_up * emitted + costs.draft_pass.seconds(emitted, 1) + (deepest - 1) * costs.draft_pass.seconds(batch, 1)


def _rate(depths, p, costs, catch_up=0.0):
    """E(d) / t(d) straight from the module docstring."""
    batch = len(p)
    emitted = batch + sum(sum(pi**k for k in range(1, d + 1)) for pi, d in zip(p, depths))
    drafter = _drafter(costs, batch, emitted, max(depths), catch_up)
    verify = costs.verify if sum(depths) else 0.0
    return emitted / (costs.fixed + verify + costs.target.seconds(batch + sum(depths)) + drafter)


@FAST
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3),
    st.integers(1, 4),
    st.floats(0.0, 0.05),
    st.floats(0.01, 1.0),
    st.floats(0.001, 1.0),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.02),
    st.sampled_from([0.0, 0.001, 0.01, 0.1]),
    st.sampled_from([0.0, 0.02, 0.2]),
)
def test_plan_is_within_min_gain_of_the_brute_force_optimum(
    p, max_depth, per_token, base, draft, fixed, per_row, catch_up, verify
):
    costs = _costs(per_token, base, draft, fixed, per_row, verify)
    plan = plan_depths(p, costs, min_depth=1, max_depth=max_depth, catch_up=catch_up)
    best = max(_rate(list(d), p, costs, catch_up) for d in itertools.product(range(max_depth + 1), repeat=len(p)))
    assert plan.rate == pytest.approx(_rate(plan.depths, p, costs, catch_up), rel=1e-9)
    _assert_near_best(plan, best)
    assert all(0 <= d <= max_depth for d in plan.depths)


def _continued_rate(lengths, drafted, passes_run, costs, copies=(0.0, 0)):
    """E / t of chains of ``lengths`` after ``passes_run`` passes, straight from the module docstring: the drafted
    tokens' gains are the running products of their estimates, later tokens the last gain times the last
    estimate per further token; the passes are max(D, j)."""
    batch, j = len(drafted), passes_run
    emitted = batch + copies[0]
    for estimates, d in zip(drafted, lengths):
        gain = 1.0
        for k in range(d):
            gain *= estimates[min(k, j - 1)]
            emitted += gain
    passes = max(max(lengths), j)
    drafter = costs.draft_pass.seconds(emitted, 1) + (passes - 1) * costs.draft_pass.seconds(batch, 1)
    seconds = costs.fixed + costs.verify + costs.target.seconds(batch + copies[1] + sum(lengths)) + drafter
    return emitted / seconds


@FAST
@given(
    st.lists(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3) | st.just([]), min_size=1, max_size=3),
    st.integers(1, 3),
    st.integers(1, 5),
    st.floats(0.0, 0.05),
    st.floats(0.01, 1.0),
    st.floats(0.001, 1.0),
    st.floats(0.0, 0.5),
    st.sampled_from([(0.0, 0), (1.5, 2)]),
    st.sampled_from([0.0, 0.05]),
)
def test_continued_chains_are_within_min_gain_of_the_brute_force_optimum(
    estimates, passes_run, max_depth, per_token, base, draft, fixed, copies, verify
):
    costs = _costs(per_token, base, draft, fixed, verify=verify)
    drafted = [e[:passes_run] for e in estimates]
    plan = continue_chains(drafted, passes_run, costs, max_depth, copies)
    top = max(passes_run, max_depth)
    choices = itertools.product(*[range(top + 1) if e else [0] for e in drafted])
    best = max(_continued_rate(list(d), drafted, passes_run, costs, copies) for d in choices)
    assert plan.rate == pytest.approx(_continued_rate(plan.lengths, drafted, passes_run, costs, copies), rel=1e-9)
    assert plan.rate >= best / (1.0 + MIN_GAIN) - 1e-12
    assert passes_run <= plan.passes <= top and max(plan.lengths) <= plan.passes
    assert all(d == 0 for d, e in zip(plan.lengths, drafted) if not e)


def test_a_doubted_token_stops_the_chain_and_sure_ones_go_deeper():
    # Batch 1, a target forward of 1 s whatever its tokens, a drafter pass of 0.3 s (a 0.5B drafter for a 1.5B
    # target on 2 cores). The first plan priced every token at the first one's estimate 0.8.
    costs = _costs(per_token=0.0, base=1.0, draft=0.3, fixed=0.05)
    first = plan_depths([0.8], costs, 1, 8).depths[0]
    doubted = continue_chains([[0.8, 0.2]], 2, costs, 8)
    assert doubted.passes == 2 and doubted.lengths[0] <= 2  # no third pass after a doubted second token
    sure = continue_chains([[0.8, 0.97, 0.97]], 3, costs, 8)
    assert sure.passes > max(3, first)  # past the first plan's depth


def test_no_continuation_until_measured():
    assert continue_chains([[0.9]], 1, StepCosts(), 4) is None


def test_the_catch_up_is_the_first_pass_beyond_a_drafting_steps_spread_over_the_tokens_ahead():
    # t_pass(r) = 0.09 + 0.01 r, measured up to 64 rows (proportional beyond: compute bound)
    costs = _costs(per_token=0.0, base=1.0, draft=0.1, fixed=0.0, draft_per_row=0.01)
    # 8 requests, 40 rows owed (32 tokens missed + the last step's 8): 0.32 s more than a pass over 8 rows,
    # over the 512 tokens ahead.
    assert catch_up_per_token(costs, 8, 40, 512.0) == pytest.approx(0.32 / 512)
    assert catch_up_per_token(costs, 8, 264, 512.0) == pytest.approx((0.73 * 264 / 64 - 0.17) / 512)
    assert catch_up_per_token(costs, 8, 8, 512.0) == 0.0  # a drafting batch's own first pass: nothing owed
    assert catch_up_per_token(costs, 8, 40, None) == 0.0  # nothing known ahead: not priced
    assert catch_up_per_token(costs, 8, 40, 0.0) == pytest.approx(0.32)  # nothing ahead: at least one token
    assert catch_up_per_token(StepCosts(), 8, 40, 512.0) == 0.0  # no drafter pass timed yet


def test_a_backlog_the_tokens_ahead_cannot_repay_keeps_the_drafter_off():
    # A drafter that pays at 60% acceptance (4 requests at depth 2: 5.3 tok/s against plain decoding's 3.8):
    # with 600 rows owed (1.4 s more than a pass over the batch) it still pays over 2,000 tokens ahead, not
    # over 20, and not even a never-wrong drafter repays it over 5.
    costs = _costs(per_token=0.0, base=1.0, draft=0.2, fixed=0.05, draft_per_row=0.002)
    assert plan_depths([0.6] * 4, costs, 1, 4).depths == [2] * 4
    assert plan_depths([0.6] * 4, costs, 1, 4, catch_up=catch_up_per_token(costs, 4, 600, 2000.0)).passes > 0
    assert plan_depths([0.6] * 4, costs, 1, 4, catch_up=catch_up_per_token(costs, 4, 600, 20.0)).passes == 0
    assert could_pay(costs, 4, 4, catch_up_per_token(costs, 4, 600, 20.0))
    assert not could_pay(costs, 4, 4, catch_up_per_token(costs, 4, 600, 5.0))


def test_no_probe_pays_beside_copies_a_perfect_drafter_could_not_beat():
    # The costs above, where a drafter at 60% pays: every request holding a whole 8-token copy that is
    # always accepted leaves even a never-wrong drafter nothing to add but its passes; a short, unsure copy
    # leaves it room.
    costs = _costs(per_token=0.0, base=1.0, draft=0.2, fixed=0.05, draft_per_row=0.002)
    assert could_pay(costs, 4, 8)
    assert not could_pay(costs, 4, 8, free=[(8, 1.0, 1.0)] * 4)
    assert could_pay(costs, 4, 8, free=[(2, 0.5, 0.5)] * 4)


@given(st.lists(st.integers(0, 50), max_size=10), st.integers(0, 60), st.integers(0, 80))
@FAST
def test_output_lengths_expect_the_mean_remainder_of_the_longer_finished_requests(lengths, n, m):
    window = OutputLengths(window=6)
    for length in lengths:
        window.observe(length)
    longer = [length - n for length in lengths[-6:] if length > n]
    expected = max(0, m - n) if not longer else min(sum(longer) / len(longer), max(0, m - n))
    assert window.ahead(n, m) == pytest.approx(expected)


def _assert_near_best(plan, best):
    """Plain decoding unless some plan beats it by MIN_GAIN_OVER_PLAIN, else within MIN_GAIN of the best."""
    if not any(plan.depths):
        assert best <= plan.plain_rate * (1.0 + MIN_GAIN_OVER_PLAIN) + 1e-12
    else:
        assert plan.rate > plan.plain_rate * (1.0 + MIN_GAIN_OVER_PLAIN)
        assert plan.rate >= best / (1.0 + MIN_GAIN) - 1e-12


def test_speculation_must_beat_plain_decoding_by_the_prices_error():
    # One request, a target forward of 1 s whatever its tokens, a drafter pass of 0.04 s:
    # depth 1 at acceptance p emits 1 + p tokens in 1.04 s.
    costs = _costs(per_token=0.0, base=1.0, draft=0.04, fixed=0.0)
    assert plan_depths([0.06], costs, 1, 1).depths == [0]  # 1.06 / 1.04: 2% faster, within the error
    assert plan_depths([0.2], costs, 1, 1).depths == [1]  # 15% faster


def _free_rate(choice, p, free, costs):
    """E / t of a plan ``choice`` = [(source, d_i)] with free drafts, from the module docstring: the k-th token
    of a free chain is accepted with chance f_i c_i^(k - 1), and free chains need no drafter pass."""
    batch = len(p)
    emitted = batch + sum(
        _copy(free[i][1], free[i][2], d) if source == "free" else _chain(p[i], d) for i, (source, d) in enumerate(choice)
    )
    deepest = max((d for source, d in choice if source == "drafter"), default=0)
    verified = sum(d for _, d in choice)
    verify = costs.verify if verified else 0.0
    seconds = costs.fixed + verify + costs.target.seconds(batch + verified) + _drafter(costs, batch, emitted, deepest)
    return emitted / seconds


def _chain(a, n):
    return sum(a**k for k in range(1, n + 1))


def _copy(f, c, n):
    return sum(f * c ** (k - 1) for k in range(1, n + 1))


def test_copy_yield_is_the_sum_of_its_tokens_chances():
    assert copy_yield(0.8, 0.9, 3) == pytest.approx(0.8 + 0.72 + 0.648)  # the worked example
    assert copy_yield(0.8, 0.9, 0) == 0.0
    got = copy_yield(np.array([0.5, 0.9, 0.7]), np.array([1.0, 0.5, 0.7]), np.array([4, 2, 0]))
    assert got == pytest.approx([2.0, 0.9 + 0.45, 0.0])
    assert copy_yield(0.7, 0.7, 5) == pytest.approx(_chain(0.7, 5))  # c = f: one per-position rate


def _free_choices(p, free, max_depth, follow_rule):
    """Every plan: per request nothing, a free chain of 1..L_i or a drafter chain of 1..max_depth; with
    ``follow_rule``, only plans whose sources follow the module docstring's source rule."""
    options = [
        [("none", 0)] + [("free", d) for d in range(1, n + 1)] + [("drafter", d) for d in range(1, max_depth + 1)]
        for n, _, _ in free
    ]
    for choice in itertools.product(*options):
        drafter_depth = max((d for source, d in choice if source == "drafter"), default=0)
        if follow_rule:
            rule = [
                n > 0 and (drafter_depth == 0 or _copy(f, c, n) >= _chain(pi, drafter_depth))
                for (n, f, c), pi in zip(free, p)
            ]
            if any((source == "free") != prefer for (source, d), prefer in zip(choice, rule) if d > 0):
                continue
        yield choice


@FAST
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.integers(0, 3), st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
        min_size=1, max_size=3,
    ),
    st.integers(1, 3),
    st.floats(0.0, 0.05),
    st.floats(0.01, 1.0),
    st.floats(0.001, 1.0),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.02),
    st.sampled_from([0.0, 0.05]),
)
def test_plan_with_free_drafts_is_the_best_plan_that_follows_the_source_rule(
    requests, max_depth, per_token, base, draft, fixed, per_row, verify
):
    p = [pi for pi, _, _, _ in requests]
    free = [(min(n, max_depth), f, c) for _, n, f, c in requests]
    costs = _costs(per_token, base, draft, fixed, per_row, verify)
    plan = plan_depths(p, costs, min_depth=1, max_depth=max_depth, free=free)
    choice = [("free" if f else "drafter", d) for f, d in zip(plan.free, plan.depths)]
    assert plan.rate == pytest.approx(_free_rate(choice, p, free, costs), rel=1e-9)
    assert all(d <= n for (n, _, _), (source, d) in zip(free, choice) if source == "free")
    best = max(_free_rate(c, p, free, costs) for c in _free_choices(p, free, max_depth, follow_rule=True))
    _assert_near_best(plan, best)
    # Against every plan (the rule can miss a free chain less sure than the drafter's that would save the
    # batch a pass):
    unrestricted = max(_free_rate(c, p, free, costs) for c in _free_choices(p, free, max_depth, False))
    assert plan.rate >= 0.9 * unrestricted


def test_a_step_of_free_drafts_only_runs_no_drafter_pass():
    costs = _costs(per_token=0.0, base=1.0, draft=0.5, fixed=0.05)
    plan = plan_depths([0.5, 0.5], costs, 1, 4, free=[(4, 0.9, 0.9), (3, 0.8, 0.8)])
    assert plan.free == [True, True] and plan.passes == 0 and min(plan.depths) >= 3
    mixed = plan_depths([0.5, 0.95], _costs(0.0, 1.0, 0.05, 0.05), 1, 4, free=[(4, 0.9, 0.9), (0, 0.0, 0.0)])
    assert mixed.free == [True, False] and mixed.passes == mixed.depths[1] > 0
    assert plan_depths([0.5], costs, 1, 4, free=[(0, 0.0, 0.0)]).free == [False]


def test_a_copy_that_runs_once_its_first_token_holds_is_priced_for_the_run():
    # A drafter pass a third of a target forward, the drafter sure (0.9); the copy's first token is a coin flip,
    # but a copy whose first token holds runs on (c = 1): its 8 tokens yield 4, more than the drafter's 4 deep
    # (3.44), with no drafter pass. Read as one per-position rate of 0.5 the same copy yields ~1 and loses.
    costs = _costs(per_token=0.002, base=0.1, draft=0.033, fixed=0.01)
    runs = plan_depths([0.9], costs, 1, 8, free=[(8, 0.5, 1.0)])
    assert runs.free == [True] and runs.passes == 0 and runs.depths == [8]
    one_rate = plan_depths([0.9], costs, 1, 8, free=[(8, 0.5, 0.5)])
    assert one_rate.free == [False] and one_rate.passes > 0


def test_verify_is_what_a_verifying_step_costs_beyond_a_plain_one():
    costs = StepCosts(window=4)
    assert costs.fixed is None and costs.verify == 0.0
    for rest in (0.011, 0.013, 0.012):  # steps that verified drafts (of 0.1 s forwards)
        costs.observe_step(0.1 + rest, 0.1, 0.0, verified=True)
    assert costs.fixed == pytest.approx(0.012) and costs.verify == 0.0  # no plain step yet: their rest is t_fixed
    for rest in (0.002, 0.004, 0.003):
        costs.observe_step(0.1 + rest, 0.1, 0.0, verified=False)
    assert costs.fixed == pytest.approx(0.003) and costs.verify == pytest.approx(0.009)
    again = StepCosts.from_snapshot(costs.snapshot())
    assert again.fixed == pytest.approx(0.003) and again.verify == pytest.approx(0.009)


def test_copies_that_do_not_pay_for_the_verifying_step_are_not_verified():
    # Batch 8 at 2 CPU cores: a plain step 160 ms (8 tokens), each verified query token ~1 ms more. Two copies
    # at q = 0.3 each emit 0.3 + 0.09 expected tokens: with verification free they pay, but not when a verifying
    # step costs 10 ms more than a plain one.
    free = [(2, 0.3, 0.3)] * 2 + [(0, 0.0, 0.0)] * 6
    cheap = _costs(per_token=0.001, base=0.15, draft=0.05, fixed=0.002)
    assert plan_depths([0.1] * 8, cheap, 1, 4, free=free).free[:2] == [True, True]
    dear = _costs(per_token=0.001, base=0.15, draft=0.05, fixed=0.002, verify=0.01)
    assert plan_depths([0.1] * 8, dear, 1, 4, free=free).depths == [0] * 8


@given(
    batch=st.integers(1, 8),
    max_depth=st.integers(1, 6),
    per_token=st.floats(0.0, 0.02),
    base=st.floats(0.001, 0.1),
    draft=st.floats(0.001, 0.1),  # a pass of 0 s is not a measurement
    fixed=st.floats(0.0, 0.05),
    per_row=st.floats(0.0, 0.002),
)
@FAST
def test_could_pay_is_whether_any_perfectly_accepted_draft_beats_plain_decoding(
    batch, max_depth, per_token, base, draft, fixed, per_row
):
    # Brute force: with every draft accepted, N verified draft tokens emit B + N tokens for at least
    # D = ceil(N / B) levels: the next first pass over B + N rows, then D - 1 passes over B.
    costs = _costs(per_token, base, draft, fixed, per_row)
    plain = batch / (fixed + costs.target.seconds(batch))
    best = max(
        (batch + n) / (fixed + costs.target.seconds(batch + n) + _drafter(costs, batch, batch + n, -(-n // batch)))
        for n in range(1, batch * max_depth + 1)
    )
    assert could_pay(costs, batch, max_depth) == (best > plain * (1 + MIN_GAIN_OVER_PLAIN))


def test_could_pay_until_the_costs_are_measured():
    assert could_pay(StepCosts(), 4, 4)


def test_pooled_acceptance_is_the_windowed_rate_of_every_request():
    pooled = PooledAcceptance(window=3)
    assert pooled.rate() is None
    pooled.observe(4, 4)  # 4 accepted of 4 trials (the whole draft)
    pooled.observe(4, 1)  # 1 of 2: the second token was rejected
    pooled.observe(0, 0)  # nothing drafted: not a draft
    assert pooled.rate() == 5 / 6
    pooled.observe(2, 0)
    pooled.observe(2, 0)  # the window keeps the last 3 drafts: 1/2, 0/1, 0/1
    assert pooled.rate() == 1 / 4


def test_speculation_off_when_the_drafter_cannot_pay():
    # drafter pass 0.8 of a forward, 43% acceptance: plain decoding wins (the smollm2 pair's numbers)
    costs = _costs(per_token=0.0, base=1.0, draft=0.8, fixed=0.05)
    assert plan_depths([0.43] * 4, costs, 1, 8).depths == [0, 0, 0, 0]


def test_deep_chains_when_drafting_is_cheap_and_accurate():
    costs = _costs(per_token=0.0, base=1.0, draft=0.02, fixed=0.05)  # an EAGLE head, verification free
    assert min(plan_depths([0.95] * 2, costs, 1, 8).depths) >= 6


def test_a_plan_pays_for_the_first_pass_its_emitted_tokens_cause():
    # The batch-32 record on 2 cores: target 0.30 s over 32 query tokens to 0.55 s over 128, a drafter pass
    # 0.15 s over 32 rows and 0.40 s over 128 (the next step's first pass reads every emitted token).
    costs = StepCosts(window=1)
    for q, seconds in ((32, 0.30), (64, 0.36), (128, 0.55)):
        costs.target.observe(q, seconds)
    for rows, seconds in ((32, 0.15), (64, 0.22), (128, 0.40)):
        costs.draft_pass.observe(rows, seconds)
    costs.fixed = 0.05
    # At 70% per-position acceptance no plan beats plain decoding (depth 1: 54.4 tokens for 0.61 s, 89 tok/s,
    # against 32 for 0.35 s, 91 tok/s); counting this step's first pass (0.22 s) as sunk read the same depth 1
    # as 86 tok/s against 56, and drafted.
    assert plan_depths([0.7] * 32, costs, 1, 4).depths == [0] * 32
    assert plan_depths([0.95] * 32, costs, 1, 4).passes > 0  # a sure drafter still pays


def test_compute_bound_batch_drafts_less_than_a_memory_bound_one():
    p = [0.7] * 8
    free = plan_depths(p, _costs(0.0, 1.0, 0.3, 0.05), 1, 8)
    bound = plan_depths(p, _costs(0.2, 0.2, 0.3, 0.05), 1, 8)  # every query token costs a fifth of a forward
    assert sum(bound.depths) < sum(free.depths)


def test_one_deep_request_does_not_make_the_batch_pay_for_its_passes():
    # 7 unsure requests and one sure one: the sure one's depth is limited by the whole batch's pass cost
    costs = _costs(per_token=0.0, base=1.0, draft=0.3, fixed=0.05)
    alone = plan_depths([0.95], costs, 1, 8).depths[0]
    together = plan_depths([0.95] + [0.1] * 7, costs, 1, 8).depths
    assert together[0] <= alone


def test_min_depth_raises_and_allow_off_false_forces_drafting():
    costs = _costs(per_token=0.0, base=1.0, draft=0.8, fixed=0.05)
    assert plan_depths([0.43, 0.43], costs, 3, 3, allow_off=False).depths == [3, 3]
    cheap = _costs(per_token=0.0, base=1.0, draft=0.01, fixed=0.05)
    assert all(d == 0 or d >= 4 for d in plan_depths([0.3, 0.9], cheap, 4, 8).depths)


def test_no_plan_until_measured():
    costs = StepCosts()
    assert plan_depths([0.5], costs, 1, 4) is None
    costs.target.observe(1, 1.0)
    costs.draft_pass.observe(1, 0.3)
    assert plan_depths([0.5], costs, 1, 4) is None  # one target bucket: no slope yet
    costs.target.observe(8, 1.2)
    assert plan_depths([0.5], costs, 1, 4) is not None


def test_bucketed_time_interpolates_and_extrapolates():
    t = BucketedTime(window=1)
    t.observe(4, 1.0)
    assert t.seconds(100) is None and t.seconds(100, min_points=1) == 1.0
    t.observe(16, 2.0)
    assert t.seconds(2) == 1.0  # flat below
    assert t.seconds(10) == pytest.approx(1.5)  # linear between
    assert t.seconds(32) == pytest.approx(4.0)  # proportional above


def test_a_bucket_is_placed_at_the_sizes_it_was_read_at():
    # Batch 32 drafting 4-6 deep reads forwards of 160-224 tokens into bucket 256; a true cost linear in q
    # must be priced at those sizes as read, not as if they had been read at 256 (30% too cheap at 192).
    t = BucketedTime(window=8)
    for q in (32, 32, 160, 192, 192, 224):
        t.observe(q, 0.2 + 0.004 * (q - 32))
    assert t.seconds(192) == pytest.approx(0.2 + 0.004 * 160)
    assert t.seconds(100) == pytest.approx(0.2 + 0.004 * 68)  # linear between (32, 0.2) and (192, 0.84)
    assert t.fitted() == {32: pytest.approx(0.2), 192: pytest.approx(0.84)}
    assert StepCosts.from_snapshot({"target": t.fitted(), "draft_pass": {8: 0.1}, "fixed": 0.0}).target.seconds(
        192
    ) == pytest.approx(0.84)


def _brute_force_monotone_fit(values, weights):
    """The isotonic fit is constant on contiguous blocks, each at its weighted mean: try every split into
    blocks whose means do not decrease and keep the one with the least weighted squared error."""
    n, best = len(values), None
    for cuts in itertools.product((False, True), repeat=n - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        fit = []
        for lo, hi in zip(bounds, bounds[1:]):
            w = sum(weights[lo:hi])
            fit += [sum(v * x for v, x in zip(values[lo:hi], weights[lo:hi])) / w] * (hi - lo)
        if any(a > b + 1e-12 for a, b in zip(fit, fit[1:])):
            continue
        error = sum(w * (v - f) ** 2 for v, w, f in zip(values, weights, fit))
        if best is None or error < best[0] - 1e-12:
            best = (error, fit)
    return best[1]


@FAST
@given(st.lists(st.tuples(st.floats(0.0, 10.0), st.integers(1, 5)), min_size=1, max_size=7))
def test_monotone_fit_matches_brute_force(points):
    values, weights = [v for v, _ in points], [w for _, w in points]
    fit = monotone_fit(values, weights)
    assert all(a <= b + 1e-9 for a, b in zip(fit, fit[1:]))
    # abs 1e-6: blocks whose values lie ~1e-7 apart differ in squared error by ~1e-14, below what the brute
    # force's error comparison resolves, so either grouping is its answer.
    assert fit == pytest.approx(_brute_force_monotone_fit(values, weights), abs=1e-6)


def test_bucketed_time_is_robust_to_stalls_and_never_cheaper_for_more_tokens():
    t = BucketedTime(window=8)
    for _ in range(8):
        t.observe(8, 0.20)
        t.observe(16, 0.21)
    t.observe(8, 2.0)  # one stall of the machine
    assert t.seconds(8) == pytest.approx(0.20)  # the median ignores it
    for _ in range(8):
        t.observe(8, 0.25)  # the 8-token bucket is re-measured slower than the 16-token one
    assert t.seconds(8) == pytest.approx(t.seconds(16))  # pooled: 16 tokens do not look cheaper
    assert t.seconds(12) == pytest.approx(t.seconds(8))


def test_a_drafter_timed_only_over_prompts_is_not_read_as_that_dear_for_a_decode_pass():
    # The drafter's first timed pass read two 256-token prompts: 0.5 s. A pass over the batch's 8 rows is read
    # proportionally (optimistic, then measured), not as 0.5 s, which would keep a paying drafter off for good.
    costs = _costs(per_token=0.0, base=0.1, draft=0.0, fixed=0.0)
    costs.draft_pass = BucketedTime(window=1, proportional_below=True)
    costs.draft_pass.observe(512, 0.5)
    assert costs.draft_pass.seconds(8, min_points=1) == pytest.approx(0.5 * 8 / 512)
    assert could_pay(costs, 8, 4) and plan_depths([0.9] * 8, costs, 1, 4).passes > 0
    flat = BucketedTime(window=1)  # the target's reading: flat below (a small forward is memory bound)
    flat.observe(512, 0.5)
    assert flat.seconds(8, min_points=1) == 0.5


def test_fixed_cost_ignores_idle_gaps():
    costs = StepCosts(window=1)
    costs.observe_step(1.2, 0.9, 0.2, verified=False)
    assert costs.fixed == pytest.approx(0.1)
    costs.observe_step(30.0, 0.9, 0.2, verified=False)  # the engine waited for requests
    assert costs.fixed == pytest.approx(0.1)


def test_calibration_reads_a_saturated_confidence_as_its_observed_acceptance():
    cal = ConfidenceCalibration(prior_weight=8.0)
    assert cal(0.95) == pytest.approx(0.95)  # no evidence: the raw confidence
    for i in range(200):
        cal.observe(0.99, first_accepted=i % 2 == 0)
    assert cal(0.99) == pytest.approx(0.5, abs=0.03)
    assert cal(0.5) == pytest.approx(0.5)  # other bins untouched


def test_hindsight_prices_policy_fixed_depths_and_oracle_alike():
    costs = _costs(per_token=0.1, base=1.0, draft=0.3, fixed=0.0, draft_per_row=0.01)
    t, t_pass = costs.target.seconds, lambda rows: costs.draft_pass.seconds(rows, 1)

    def drafter(emitted, levels):  # the next first pass over the emitted tokens, then levels - 1 over 1 row
        return 0.0 if levels == 0 else t_pass(emitted) + (levels - 1) * t_pass(1)

    # Two steps, one request each: a draft of 2 fully accepted, then a draft of 3 cut after 1.
    records = [{"drafted": [2], "accepted": [2], "passes": 2}, {"drafted": [3], "accepted": [1], "passes": 3}]
    result = hindsight(records, costs, max_depth=3)
    policy = (3 + 2) / ((t(3) + drafter(3, 2)) + (t(4) + drafter(2, 3)))
    assert result["policy"] == pytest.approx(policy)
    k1 = (2 + 2) / (2 * (t(2) + drafter(2, 1)))  # depth 1 accepts 1 token in both steps
    assert result["fixed"][1] == pytest.approx(k1)
    assert result["fixed"][0] == pytest.approx(2 / (2 * t(1)))
    # The oracle: step 1 drafts its 2 sure tokens, step 2 its 1, or less where that pays; brute force:
    best = 0.0
    for g1 in range(3):
        for d1 in range(g1, 4):
            for g2 in range(2):
                for d2 in range(g2, 4):
                    if (g1 and not d1) or (g2 and not d2):
                        continue
                    rate = (2 + g1 + g2) / (t(1 + g1) + drafter(1 + g1, d1) + t(1 + g2) + drafter(1 + g2, d2))
                    best = max(best, rate)
    assert result["oracle"] == pytest.approx(best)
    assert result["regret"] == pytest.approx(1 - policy / best)
    assert result["oracle"] >= max(result["fixed"]) - 1e-12 and result["oracle"] >= result["policy"] - 1e-12


def test_hindsight_needs_records_and_a_fitted_model():
    assert hindsight([], _costs(0.0, 1.0, 0.3, 0.0), 4) is None
    assert hindsight([{"drafted": [1], "accepted": [1], "passes": 1}], StepCosts(), 4) is None


def test_a_stale_bucket_restarts_and_is_interpolated_over():
    # A run's early readings (plain decoding's 32-token forward read dear) must not price that forward for
    # the rest of the run once the engine has moved on: stale readings restart, and a stale bucket between
    # fresh ones is left out of the fit.
    t = BucketedTime(window=8, stale_after=10)
    for _ in range(8):
        t.observe(32, 0.32)
        t.observe(64, 0.32)
    for _ in range(11):
        t.observe(256, 1.2)  # the plan drafts deep: only the 256-token bucket is read
    assert t.age(32) == 12 and t.age(64) == 11 and t.age(256) == 0 and t.age(1024) is None
    assert t.seconds(64) == pytest.approx(0.32)  # 32 is stale and at the low end: still the fit's floor
    t.observe(32, 0.21)  # one fresh reading replaces the stale ones, not outvoted by them
    assert t.seconds(32) == pytest.approx(0.21)
    # 64 is stale between fresh 32 and 256: interpolated, 0.21 + (64 - 32) / (256 - 32) * (1.2 - 0.21)
    assert t.seconds(64) == pytest.approx(0.21 + 32 / 224 * 0.99)
    t.observe(64, 0.5)
    assert t.seconds(64) == pytest.approx(0.5)


def test_stretches_count_what_the_plan_turned_on_until_it_turned_it_off():
    stretches = Stretches(window=2, min_stretches=1)
    assert stretches.mean() is None
    stretches.step(True, 8, started_by_plan=False)  # a probe's step: starts nothing
    stretches.step(False, 8, started_by_plan=True)
    assert stretches.mean() is None
    for _ in range(5):  # the plan turns it on: 5 steps of 8 requests, then off
        stretches.step(True, 8, started_by_plan=True)
    stretches.step(False, 8, started_by_plan=True)
    assert stretches.mean() == 40
    stretches.step(True, 4, started_by_plan=True)
    stretches.step(True, 2, started_by_plan=False)  # a stretch goes on whatever started the step
    stretches.step(False, 2, started_by_plan=True)
    assert stretches.mean() == 23
    stretches.step(True, 1, started_by_plan=True)
    stretches.step(False, 1, started_by_plan=True)  # the window keeps the last two: 6 and 1
    assert stretches.mean() == 3.5


def test_a_stretch_cut_only_by_a_backlog_is_dropped_and_one_stretch_is_no_estimate():
    stretches = Stretches(window=4, min_stretches=2)
    for _ in range(3):
        stretches.step(True, 1, started_by_plan=True)
    stretches.step(False, 1, started_by_plan=True, on_merits=False)  # off only for a new prompt's catch-up
    assert stretches.mean() is None
    stretches.step(True, 1, started_by_plan=True)
    stretches.step(False, 1, started_by_plan=True)  # the plan turned it off on the merits: one stretch of 1
    assert stretches.mean() is None  # one stretch is no estimate
    for _ in range(5):
        stretches.step(True, 1, started_by_plan=True)
    stretches.step(False, 1, started_by_plan=True)
    assert stretches.mean() == 3  # (1 + 5) / 2: the dropped stretch of 3 is not among them
