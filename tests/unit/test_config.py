"""Configuration: loading, and errors that name the field and its allowed range."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_adaptivespec.config import AdaptiveSpecConfig, AdaptiveSpecConfigError

FAST = settings(max_examples=100, deadline=None, derandomize=True)

INT_RANGES = {
    "min_depth": (1, 64), "max_depth": (1, 64), "min_width": (1, 16), "max_width": (1, 16),
    "min_nodes": (1, 128), "max_nodes": (1, 128), "history_window": (1, 4096),
    "max_promotions_per_step": (0, 64), "max_promotions_per_window": (0, 1_000_000),
    "batch_node_budget": (1, 1_000_000),
}
UNIT_FIELDS = [
    "confidence_weight", "prior_acceptance", "wide_below",
    "narrow_above", "promotion_min_acceptance",
]


@FAST
@given(st.floats(-2, 12))
def test_draft_cost_names_field_and_range(value):
    try:
        AdaptiveSpecConfig.parse({"draft_cost": value})
    except AdaptiveSpecConfigError as err:
        assert not 0 <= value <= 10
        assert f"adaptivespec.draft_cost: must be a number in [0.0, 10.0] (got {value!r})" in str(err)
    else:
        assert 0 <= value <= 10


# (0, 1] fields: tau and the loosest per-request tau.
OPEN_UNIT_FIELDS = ["tau", "min_request_tau"]


def problems(value) -> list[str]:
    with pytest.raises(AdaptiveSpecConfigError) as info:
        AdaptiveSpecConfig.parse(value)
    assert isinstance(info.value, ValueError)
    for line in info.value.problems:
        assert re.match(r"adaptivespec\.[a-z_<>]+: .+", line), line
        assert line in str(info.value)
    return info.value.problems


def test_defaults_and_loading_forms():
    default = AdaptiveSpecConfig.parse(None)
    assert default == AdaptiveSpecConfig() and default.lossless
    assert AdaptiveSpecConfig.parse(default) is default
    from_json = AdaptiveSpecConfig.parse(json.dumps({"tau": 0.7, "mode": "tree", "max_depth": 8}))
    assert from_json == AdaptiveSpecConfig.parse({"tau": 0.7, "mode": "tree", "max_depth": 8})
    assert from_json.tau == 0.7 and not from_json.lossless
    assert AdaptiveSpecConfig.parse("") == default
    assert AdaptiveSpecConfig.parse(default.model_dump_json()) == default


def test_config_is_frozen():
    config = AdaptiveSpecConfig()
    with pytest.raises(Exception):
        config.tau = 0.5
    assert hash(config) == hash(AdaptiveSpecConfig())


def test_unknown_key_is_named():
    (line,) = problems({"tau": 0.5, "max_dept": 4})
    assert line.startswith("adaptivespec.max_dept: unknown key") and "max_depth" in line


def test_every_bad_field_is_reported_at_once():
    lines = problems({"tau": 0, "max_width": 17, "mode": "forest", "enabled": "yes"})
    assert [line.split(":")[0] for line in lines] == [
        "adaptivespec.enabled", "adaptivespec.mode", "adaptivespec.tau", "adaptivespec.max_width",
    ]
    assert "(0.0, 1.0] (got 0)" in lines[2]
    assert "[1, 16] (got 17)" in lines[3]
    assert "'chain', 'tree'" in lines[1]


@FAST
@given(st.sampled_from(OPEN_UNIT_FIELDS), st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)))
def test_taus_are_accepted_exactly_in_their_range(field, value):
    # min_request_tau set to the same value keeps the tau >= min_request_tau check out of the way.
    both = {"tau": value, "min_request_tau": value}
    if isinstance(value, float) and value == value and 0 < value <= 1 or isinstance(value, int) and value == 1:
        assert getattr(AdaptiveSpecConfig.parse(both), field) == value
    else:
        lines = problems({field: value})
        assert lines[0].startswith(f"adaptivespec.{field}: must be a number in (0.0, 1.0]")
        assert lines[0].endswith(f"(got {value!r})")


@FAST
@given(st.sampled_from(sorted(INT_RANGES)), st.integers(-10**7, 10**7))
def test_integer_fields_name_field_and_range(field, value):
    low, high = INT_RANGES[field]
    try:
        AdaptiveSpecConfig.parse({field: value})
    except AdaptiveSpecConfigError as err:
        text = str(err)
        if not low <= value <= high:
            assert f"adaptivespec.{field}: must be an integer in [{low}, {high}] (got {value})" in text
        else:  # in range: only a cross-field check may complain, and it names the field too
            assert f"adaptivespec.{field}" in text or re.search(r"adaptivespec\.(min|max)_\w+", text)
    else:
        assert low <= value <= high


@FAST
@given(st.sampled_from(UNIT_FIELDS), st.floats(-2, 3))
def test_unit_fields_name_field_and_range(field, value):
    try:
        AdaptiveSpecConfig.parse({field: value})
    except AdaptiveSpecConfigError as err:
        if not 0 <= value <= 1:
            assert f"adaptivespec.{field}: must be a number in [0.0, 1.0] (got {value!r})" in str(err)
        else:
            assert "adaptivespec." in str(err) and "must be <" in str(err)
    else:
        assert 0 <= value <= 1


@pytest.mark.parametrize(
    "value, fragment",
    [
        ({"min_depth": 5, "max_depth": 3}, "adaptivespec.min_depth: must be <= max_depth (3) (got 5)"),
        ({"min_width": 4, "max_width": 2}, "adaptivespec.min_width: must be <= max_width (2) (got 4)"),
        ({"min_nodes": 30, "max_nodes": 20}, "adaptivespec.min_nodes: must be <= max_nodes (20) (got 30)"),
        ({"max_depth": 10, "max_nodes": 8}, "adaptivespec.max_nodes: must be >= max_depth (10)"),
        ({"wide_below": 0.9, "narrow_above": 0.5}, "adaptivespec.wide_below: must be < narrow_above (0.5) (got 0.9)"),
        ({"wide_below": 0.7, "narrow_above": 0.7}, "adaptivespec.wide_below: must be < narrow_above (0.7) (got 0.7)"),
        ({"tau": 0.2, "min_request_tau": 0.4}, "adaptivespec.tau: must be >= min_request_tau (0.4)"),
        (
            {"max_promotions_per_step": 5, "max_promotions_per_window": 2},
            "adaptivespec.max_promotions_per_step: must be <= max_promotions_per_window (2) (got 5)",
        ),
    ],
)
def test_cross_field_checks_name_the_fields(value, fragment):
    assert fragment in "\n".join(problems(value))


def test_wrong_types_and_bad_json():
    assert problems({"max_depth": 4.0})[0].startswith("adaptivespec.max_depth: must be an integer")
    assert problems({"min_depth": True})[0].startswith("adaptivespec.min_depth: must be an integer")
    assert problems({"tau": "0.5"})[0].startswith("adaptivespec.tau: must be a number")
    assert "not valid JSON" in problems("{tau: 1}")[0]
    assert "must be a JSON object" in problems("[1, 2]")[0]


def test_with_overrides_validates():
    base = AdaptiveSpecConfig(mode="tree")
    lossy = base.with_overrides(tau=0.6)
    assert lossy.tau == 0.6 and lossy.mode == "tree" and base.tau == 1.0
    assert base.with_overrides() is base
    with pytest.raises(AdaptiveSpecConfigError, match=r"adaptivespec\.tau: .*\(got 1\.5\)"):
        base.with_overrides(tau=1.5)
    with pytest.raises(AdaptiveSpecConfigError, match=r"adaptivespec\.taux: unknown key"):
        base.with_overrides(taux=0.5)


def test_direct_construction_raises_the_same_error():
    with pytest.raises(AdaptiveSpecConfigError, match=r"adaptivespec\.max_depth: must be an integer in \[1, 64\]"):
        AdaptiveSpecConfig(max_depth=0)


def test_error_accepts_a_single_message():
    err = AdaptiveSpecConfigError("adaptivespec.mode: only 'chain' runs inside vLLM so far (got 'tree')")
    assert err.problems == ["adaptivespec.mode: only 'chain' runs inside vLLM so far (got 'tree')"]
    assert str(err).endswith("(got 'tree')")
