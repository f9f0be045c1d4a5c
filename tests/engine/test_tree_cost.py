"""The hardware node budget: measured verification cost -> per-request node cap."""

from __future__ import annotations

import pytest

from vllm_adaptivespec.engine.verify_cost import DraftCost, VerifyCost

# 2 CPU cores, Qwen2.5-Coder-1.5B: relative cost of 1, 4, 8, 16, 32 query tokens.
QWEN_ON_2_CORES = {1: 1.0, 4: 1.0, 8: 1.3, 16: 1.5, 32: 2.1}


def measured(curve: dict[int, float]) -> VerifyCost:
    cost = VerifyCost()
    for tokens, seconds in curve.items():
        cost.observe(tokens, seconds)
    return cost


def test_unmeasured_hardware_leaves_the_policy_alone():
    cost = VerifyCost()
    assert cost.node_cap(1, 0.6, 16) == 16
    cost.observe(3, 0.2)  # one bucket is not a curve
    assert cost.node_cap(1, 0.6, 16) == 16


def test_interpolates_between_buckets_and_scales_beyond_the_largest():
    cost = measured(QWEN_ON_2_CORES)
    assert cost.seconds(1) == 1.0 and cost.seconds(4) == 1.0
    assert cost.seconds(6) == pytest.approx(1.15)
    assert cost.seconds(64) == pytest.approx(4.2)


@pytest.mark.parametrize(
    "acceptance, expected",
    [(0.6, 3), (0.9, 15)],  # worked out in verify_cost's docstring formula by hand
)
def test_cap_follows_acceptance_on_the_measured_curve(acceptance, expected):
    assert measured(QWEN_ON_2_CORES).node_cap(1, acceptance, 32) == expected


def test_free_nodes_are_all_used_and_costly_ones_only_when_they_pay():
    flat = measured({1: 1.0, 64: 1.0})
    assert flat.node_cap(1, 0.9, 24) == 24
    assert flat.node_cap(1, 0.3, 24) < 8  # nodes that add under 0.1% of tokens are not worth drafting
    steep = measured({1: 1.0, 2: 2.0, 4: 4.0})  # compute bound: every token costs a full step
    assert steep.node_cap(1, 0.9, 24) == 1


def test_bigger_batches_get_fewer_nodes_each():
    cost = measured(QWEN_ON_2_CORES)
    assert cost.node_cap(4, 0.8, 32) < cost.node_cap(1, 0.8, 32)


def test_measurements_are_the_median_per_bucket():
    cost = VerifyCost()
    cost.observe(5, 1.0)
    cost.observe(7, 2.0)  # same bucket (8)
    cost.observe(6, 1.2)
    cost.observe(1, 1.0)
    assert cost.seconds(6) == pytest.approx(1.2)  # the bucket's median time, at its median size


def test_draft_cost_is_the_smoothed_ratio_of_a_pass_to_a_target_forward():
    cost = DraftCost(smoothing=0.5)
    assert cost.ratio() is None
    cost.observe_draft(0.3, passes=3)  # 0.1 s per pass
    assert cost.ratio() is None  # no target forward timed yet
    cost.observe_target(0.25)
    assert cost.ratio() == pytest.approx(0.4)
    cost.observe_draft(0.4, passes=2)  # 0.2 s per pass: smoothed to 0.15
    cost.observe_target(0.25)
    assert cost.ratio() == pytest.approx(0.6)
    cost.observe_draft(1.0, passes=0)  # nothing to learn from
    cost.observe_target(0.0)
    assert cost.ratio() == pytest.approx(0.6)
