"""Shape policy: bounds, monotonicity, rolling history, and the lossy budget."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.margin import verify_greedy
from vllm_adaptivespec.policy import PolicyBank, SequencePolicy, best_depth, tree_capacity
from vllm_adaptivespec.tree import DraftTrees

FAST = settings(max_examples=200, deadline=None, derandomize=True)
unit = st.floats(0.0, 1.0)


@st.composite
def configs(draw):
    def pair(low, high):
        a, b = sorted((draw(st.integers(low, high)), draw(st.integers(low, high))))
        return a, b

    def thresholds():
        low = draw(st.floats(0.0, 0.95))
        return low, draw(st.floats(low + 0.01, 1.0))

    min_depth, max_depth = pair(1, 12)
    min_width, max_width = pair(1, 6)
    max_nodes = draw(st.integers(max_depth, 128))
    min_nodes = draw(st.integers(1, max_nodes))
    wide, narrow = thresholds()
    per_step = draw(st.integers(0, 5))
    return AdaptiveSpecConfig(
        mode=draw(st.sampled_from(["chain", "tree"])),
        tau=draw(st.floats(0.1, 1.0)),
        min_depth=min_depth, max_depth=max_depth, min_width=min_width, max_width=max_width,
        min_nodes=min_nodes, max_nodes=max_nodes,
        history_window=draw(st.integers(1, 20)),
        confidence_weight=draw(unit), prior_acceptance=draw(unit),
        draft_cost=draw(st.floats(0.0, 2.0)), wide_below=wide, narrow_above=narrow,
        max_promotions_per_step=per_step,
        max_promotions_per_window=draw(st.integers(per_step, 12)),
        batch_node_budget=draw(st.integers(1, 600)),
    )


node_caps = st.one_of(st.none(), st.integers(1, 130))


@FAST
@given(configs(), unit, st.integers(1, 300), node_caps)
def test_shape_is_within_bounds(config, signal, batch_size, node_cap):
    shape = SequencePolicy(config).shape_for_signal(signal, batch_size, node_cap)
    cap = min(config.max_nodes, max(config.min_nodes, config.batch_node_budget // batch_size))
    if node_cap is not None:
        cap = min(cap, node_cap)
    assert 1 <= shape.depth <= min(config.max_depth, cap)
    assert shape.depth >= min(config.min_depth, cap)
    if config.mode == "chain":
        assert shape.width == 1 and shape.nodes == shape.depth
    else:
        assert config.min_width <= shape.width <= config.max_width
    assert shape.depth <= shape.nodes <= min(config.max_nodes, cap, tree_capacity(shape.depth, shape.width))


@FAST
@given(configs(), st.lists(unit, min_size=2, max_size=8), st.integers(1, 300), node_caps)
def test_depth_rises_and_width_falls_with_the_signal(config, signals, batch_size, node_cap):
    policy = SequencePolicy(config)
    shapes = [policy.shape_for_signal(s, batch_size, node_cap) for s in sorted(signals)]
    for low, high in zip(shapes, shapes[1:]):
        assert low.depth <= high.depth
        assert low.width >= high.width


@FAST
@given(configs(), unit, st.lists(st.integers(1, 300), min_size=2, max_size=8), node_caps)
def test_nodes_and_depth_shrink_as_the_batch_grows(config, signal, batches, node_cap):
    policy = SequencePolicy(config)
    shapes = [policy.shape_for_signal(signal, b, node_cap) for b in sorted(batches)]
    for small, large in zip(shapes, shapes[1:]):
        assert small.nodes >= large.nodes
        assert small.depth >= large.depth


@FAST
@given(configs(), st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=30), st.lists(unit, min_size=2, max_size=6))
def test_signal_fuses_confidence_and_rolling_history(config, steps, confidences):
    policy = SequencePolicy(config)
    history = []
    for drafted, accepted in steps:
        accepted = min(accepted, drafted)
        policy.observe(drafted, accepted, 0)
        if drafted:
            history.append((accepted, accepted + (accepted < drafted)))
    window = history[-config.history_window :]
    trials = sum(t for _, t in window)
    rate = sum(a for a, _ in window) / trials if trials else config.prior_acceptance
    assert math.isclose(policy.acceptance_rate, rate)
    w = config.confidence_weight
    signals = [policy.signal(c) for c in sorted(confidences)]
    for c, s in zip(sorted(confidences), signals):
        assert 0.0 <= s <= 1.0
        assert math.isclose(s, min(1.0, w * c + (1 - w) * rate), abs_tol=1e-12)
    assert signals == sorted(signals)
    depths = [policy.shape(c).depth for c in sorted(confidences)]
    assert depths == sorted(depths)


def test_signal_clamps_odd_confidence_values():
    policy = SequencePolicy(AdaptiveSpecConfig(confidence_weight=1.0))
    assert policy.signal(float("nan")) == 0.0
    assert policy.signal(-3.0) == 0.0 and policy.signal(7.0) == 1.0


def test_default_tree_policy_varies_the_node_count():
    policy = SequencePolicy(AdaptiveSpecConfig(mode="tree"))
    counts = {policy.shape_for_signal(s / 20).nodes for s in range(21)}
    assert len(counts) >= 3  # the total draft count changes with the signal, it is not a fixed budget


@FAST
@given(
    configs(),
    st.lists(st.tuples(st.integers(1, 8), st.floats(0, 1), st.booleans(), st.booleans()), min_size=1, max_size=60),
)
def test_lossy_budget_is_never_exceeded(config, steps):
    """Whatever a step does with its allowance, and whichever source drafted it (the drafter, or a free
    copy recorded with ``observe_promotions``), no step and no window of history_window steps holds more
    promotions than configured."""
    policy = SequencePolicy(config)
    promoted_per_step = []
    for drafted, accept_fraction, use_all, free in steps:
        allowance = policy.promotion_allowance()
        assert 0 <= allowance <= config.max_promotions_per_step
        if config.lossless:
            assert allowance == 0
        accepted = round(accept_fraction * drafted)
        promoted = min(allowance, accepted) if use_all else min(allowance, accepted) // 2
        if free:
            policy.observe_promotions(promoted)
        else:
            policy.observe(drafted, accepted, promoted)
        promoted_per_step.append(promoted)
    window = config.history_window
    for start in range(len(promoted_per_step)):
        assert sum(promoted_per_step[start : start + window]) <= config.max_promotions_per_window


def test_lossy_budget_holds_through_real_verification():
    """Policy + margin verification in a loop on targets where nearly every draft is promotable."""
    config = AdaptiveSpecConfig(tau=0.2, max_depth=6, max_nodes=6, history_window=5,
                                max_promotions_per_step=2, max_promotions_per_window=3,
                                promotion_min_acceptance=0.0)  # this drafter never agrees: the budgets alone
    policy = SequencePolicy(config)
    gen = torch.Generator().manual_seed(0)
    per_step = []
    for _ in range(60):
        shape = policy.shape(0.9)
        tokens = torch.randint(1, 4, (1, shape.depth), generator=gen)
        logits = torch.zeros(1, shape.depth + 1, 4)
        logits[:, :, 0] = 0.5  # token 0 is the top-1; drafted tokens 1..3 have ratio e^-0.5 > tau
        allowance = policy.promotion_allowance()
        result = verify_greedy(logits, DraftTrees.chain(tokens), config.tau, torch.tensor([allowance]))
        promoted = int(result.num_promoted[0])
        assert promoted <= allowance
        policy.observe(shape.depth, int(result.num_accepted[0]), promoted)
        per_step.append(promoted)
    assert max(per_step) == 2 and sum(per_step) > 0
    for start in range(len(per_step)):
        assert sum(per_step[start : start + config.history_window]) <= config.max_promotions_per_window


def test_request_tau_decides_whether_promotions_are_allowed():
    lossless_server = SequencePolicy(AdaptiveSpecConfig())
    lossless_server.observe(4, 4, 0)  # a drafter that agrees (past the agreement floor)
    assert lossless_server.promotion_allowance() == 0
    assert lossless_server.promotion_allowance(tau=0.6) == 2  # a request asking for a margin gets one
    lossy_server = SequencePolicy(AdaptiveSpecConfig(tau=0.5))
    lossy_server.observe(4, 4, 0)
    assert lossy_server.promotion_allowance(tau=1.0) == 0  # a request asking for lossless gets none


def test_promotions_pause_while_acceptance_is_low():
    policy = SequencePolicy(AdaptiveSpecConfig(tau=0.5, promotion_min_acceptance=0.5, prior_acceptance=0.6))
    assert policy.promotion_allowance() == 2
    for _ in range(4):
        policy.observe(4, 0, 0)
    assert policy.acceptance_rate == 0.0 and policy.promotion_allowance() == 0


def test_promotions_do_not_vouch_for_more_promotions():
    """The floor reads strict agreement: a window whose accepted tokens are mostly promotions is a drafter that
    disagrees, and it loses its allowance although its acceptance (promotions counted) looks high."""
    policy = SequencePolicy(AdaptiveSpecConfig(tau=0.3, promotion_min_acceptance=0.7, max_promotions_per_step=4,
                                               max_promotions_per_window=1000))
    for _ in range(4):
        policy.observe(4, 4, 2)  # 4 drafted, all accepted, 2 of them promoted: trials 4, agreed 2
    assert policy.acceptance_rate == 1.0 and policy.agreement_rate == 0.5
    assert policy.promotion_allowance() == 0
    for _ in range(16):
        policy.observe(4, 4, 0)
    assert policy.agreement_rate == 1.0 and policy.promotion_allowance() == 4
    policy.observe_promotions(3)  # a free copy's promotions count toward the budget, not against this drafter
    assert policy.agreement_rate == 1.0 and policy.promotion_allowance() == 4


def test_agreement_floor_holds_back_a_new_request_until_its_drafter_has_agreed():
    policy = SequencePolicy(AdaptiveSpecConfig(tau=0.5))  # defaults: prior 0.6 below the 0.7 floor
    assert policy.agreement_rate == policy.config.prior_acceptance and policy.promotion_allowance() == 0
    policy.observe(4, 4, 0)
    assert policy.promotion_allowance() == policy.config.max_promotions_per_step


def test_observe_rejects_impossible_steps():
    policy = SequencePolicy(AdaptiveSpecConfig())
    for args in [(2, 3, 0), (3, 1, 2), (-1, 0, 0)]:
        try:
            policy.observe(*args)
        except ValueError:
            continue
        raise AssertionError(f"observe{args} was accepted")


def test_policy_bank_creates_and_frees():
    bank = PolicyBank(AdaptiveSpecConfig())
    first = bank["a"]
    assert bank["a"] is first and len(bank) == 1 and "a" in bank
    lossy = bank.get("b", AdaptiveSpecConfig(tau=0.5))
    assert lossy.config.tau == 0.5 and len(bank) == 2 and set(bank) == {"a", "b"}
    bank.free("a")
    bank.free("missing")
    assert len(bank) == 1 and "a" not in bank


@FAST
@given(unit, st.integers(1, 10), st.integers(0, 10), st.floats(0.0, 3.0))
def test_depth_maximises_expected_tokens_per_step_cost(signal, min_depth, extra, draft_cost):
    """best_depth equals a brute-force argmax of expected emitted tokens per unit of step cost."""
    max_depth = min_depth + extra
    rate = lambda d: sum(signal**i for i in range(d + 1)) / (1 + draft_cost * d)  # noqa: E731
    chosen = best_depth(signal, min_depth, max_depth, draft_cost)
    assert min_depth <= chosen <= max_depth
    assert rate(chosen) >= max(rate(d) for d in range(min_depth, max_depth + 1)) * (1 - 1e-12)


def test_expensive_drafter_drafts_shallower_and_confident_one_deeper():
    cheap, costly = (SequencePolicy(AdaptiveSpecConfig(max_depth=8, draft_cost=c)) for c in (0.05, 0.5))
    assert costly.shape_for_signal(0.75).depth < cheap.shape_for_signal(0.75).depth
    assert costly.shape_for_signal(0.5).depth < costly.shape_for_signal(0.97).depth
    assert cheap.shape_for_signal(1.0).depth == 8  # nothing is lost to rejections: use all of it
    assert costly.shape_for_signal(0.0).depth == 1


@FAST
@given(unit, st.floats(0.0, 3.0), st.integers(1, 16))
def test_measured_draft_cost_replaces_the_configured_one(signal, draft_cost, batch_size):
    measured = SequencePolicy(AdaptiveSpecConfig(max_depth=8, draft_cost=0.3))
    configured = SequencePolicy(AdaptiveSpecConfig(max_depth=8, draft_cost=draft_cost))
    assert measured.shape_for_signal(signal, batch_size, draft_cost=draft_cost) == configured.shape_for_signal(
        signal, batch_size
    )
