"""The start-up cost profile: the step plan has prices before the first request (engine/cost_profile.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginerun import run_engine
from vllm_adaptivespec.engine.cost_profile import profile_sizes

RUNNER = Path(__file__).with_name("costs_runner.py")


def test_profile_sizes_are_powers_of_two_up_to_the_largest_step():
    assert profile_sizes(8, 8, 4096) == [1, 2, 4, 8, 16, 32, 64, 72]
    assert profile_sizes(4, 3, 4096) == [1, 2, 4, 8, 16]
    assert profile_sizes(256, 8, 2048) == [1 << i for i in range(12)]  # capped by the token budget
    assert profile_sizes(1, 0, 4096) == [1]


def _costs(models, adaptivespec: dict) -> dict | None:
    engine = {
        "model": str(models.target), "max_num_seqs": 4,
        "speculative_config": {"method": "draft_model", "model": str(models.draft), "num_speculative_tokens": 4},
        "additional_config": {"adaptivespec": adaptivespec},
    }  # fmt: skip
    return run_engine({"engine": engine}, runner=RUNNER)["costs"]


@pytest.mark.engine
def test_the_plan_has_prices_before_the_first_request(tiny_models):
    costs = _costs(tiny_models, {"tau": 1.0})
    assert costs["ready"]
    # 4 requests verifying 4 tokens each: 20 query tokens at most, sizes 1 ... 16 and 20 (all profiled: the
    # tiny models take microseconds); buckets keyed by the median size read in them.
    assert sorted(int(q) for q in costs["target"]) == [1, 2, 4, 8, 16, 20]
    assert sorted(int(r) for r in costs["draft_pass"]) == [1, 2, 4, 8, 16, 20]
    assert all(seconds > 0 for seconds in costs["target"].values())


@pytest.mark.engine
def test_a_pinned_shape_profiles_nothing(tiny_models):
    # No step plan to price (min_depth = max_depth): start-up stays as stock's.
    costs = _costs(tiny_models, {"tau": 1.0, "min_depth": 4, "max_depth": 4})
    assert costs["target"] == {} and costs["draft_pass"] == {} and not costs["ready"]
