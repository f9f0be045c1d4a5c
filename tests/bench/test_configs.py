"""The configuration table: every row builds, names resolve, bad names are reported, not fatal."""

from __future__ import annotations

import pytest

from vllm_adaptivespec.bench.configs import DRAFTER, TABLE, TAU, build, select
from vllm_adaptivespec.config import AdaptiveSpecConfig

DRAFT_PATH = "/models/drafter"


def test_every_row_builds_with_its_placeholders_filled():
    for row in TABLE:
        config = build(row, DRAFT_PATH, 0.5 if row.per_tau else None)
        text = repr(config.engine_args())
        assert DRAFTER not in text and TAU not in text, row.name
        if config.needs_drafter:
            assert config.speculative_config["model"] == DRAFT_PATH


def test_row_names_unique_and_kinds_as_documented():
    names = [row.name for row in TABLE]
    assert len(names) == len(set(names))
    kinds = {row.name: row.kind for row in TABLE}
    assert kinds["ar"] == "ar" and kinds["ngram"] == "ngram" and kinds["dynamic"] == "dynamic"
    assert sorted(n for n, k in kinds.items() if k == "static") == [
        "static-k1", "static-k2", "static-k3", "static-k4", "static-k6", "static-k8"
    ]


def test_adaptivespec_rows_follow_the_plugin_contract():
    configs, rejected = select(["adaptivespec"], [0.7, 0.3], DRAFT_PATH)
    assert not rejected
    by_name = {c.name: c for c in configs}
    assert set(by_name) == {"policy-only", "policy-first-pass", "pinned-k2", "pinned-k4", "margin-k4@0.7", "margin-k4@0.3", "adaptive@0.7",
                            "adaptive@0.3", "unguarded@0.7", "unguarded@0.3", "unguarded-k4@0.7", "unguarded-k4@0.3",
                            "tree-policy-only", "adaptive-tree@0.7",
                            "adaptive-tree@0.3"}
    unguarded = by_name["unguarded@0.3"].engine_args()["additional_config"]["adaptivespec"]
    assert unguarded == {"tau": 0.3, "max_depth": 8, "max_promotions_per_step": 64,
                         "max_promotions_per_window": 1_000_000, "promotion_min_acceptance": 0.0}
    pinned_unguarded = by_name["unguarded-k4@0.3"].engine_args()["additional_config"]["adaptivespec"]
    assert pinned_unguarded == {"tau": 0.3, "min_depth": 4, "max_depth": 4, "max_promotions_per_step": 64,
                                "max_promotions_per_window": 1_000_000, "promotion_min_acceptance": 0.0}
    policy = by_name["policy-only"].engine_args()
    assert policy["additional_config"] == {"adaptivespec": {"tau": 1.0, "max_depth": 8}}
    assert policy["speculative_config"]["method"] == "draft_model"
    margin = by_name["margin-k4@0.3"].engine_args()
    assert margin["additional_config"]["adaptivespec"] == {"tau": 0.3, "min_depth": 4, "max_depth": 4}
    tree = by_name["adaptive-tree@0.3"].engine_args()["additional_config"]["adaptivespec"]
    assert tree == {"mode": "tree", "tau": 0.3, "max_depth": 8}
    static_tree, _ = select(["static-tree"], [], DRAFT_PATH)
    for config in configs + static_tree:  # shapes never exceed the buffers vLLM sizes from num_speculative_tokens
        settings = AdaptiveSpecConfig.parse(config.adaptivespec)
        ceiling = config.speculative_config["num_speculative_tokens"]
        assert settings.max_depth <= ceiling and (settings.mode == "chain" or settings.max_nodes <= ceiling)
    assert by_name["policy-only"].tau == 1.0 and AdaptiveSpecConfig.parse(by_name["policy-only"].adaptivespec).lossless


def test_pinned_rows_are_lossless_adaptivespec_in_their_stock_twins_shape():
    configs, rejected = select(["pinned-k2", "pinned-k4", "static-k2", "static-k4"], [], DRAFT_PATH)
    assert not rejected
    by_name = {c.name: c for c in configs}
    for k in (2, 4):
        pinned, stock = by_name[f"pinned-k{k}"], by_name[f"static-k{k}"]
        assert pinned.kind == "adaptivespec" and pinned.depth == k and pinned.tau == 1.0
        assert pinned.speculative_config == stock.speculative_config  # the same drafter and k: only the plugin differs
        assert pinned.adaptivespec == {"tau": 1.0, "min_depth": k, "max_depth": k, "min_nodes": k}  # no node cap below k
        settings = AdaptiveSpecConfig.parse(pinned.adaptivespec)
        assert settings.lossless and settings.measure_draft_cost and settings.min_depth == settings.max_depth == k
        row = next(r for r in TABLE if r.name == f"pinned-k{k}")
        assert row.stock_twin == f"static-k{k}" and row.lossless_twin is None and not row.per_tau


def test_static_tree_is_one_fixed_lossless_shape():
    from vllm_adaptivespec.policy import SequencePolicy, TreeShape

    (config,), _ = select(["static-tree"], [], DRAFT_PATH)
    settings = AdaptiveSpecConfig.parse(config.adaptivespec)
    assert settings.mode == "tree" and settings.lossless
    shapes = {SequencePolicy(settings).shape_for_signal(s, batch_size=b) for s in (0.0, 0.5, 1.0) for b in (1, 8)}
    assert shapes == {TreeShape(depth=4, width=2, nodes=8)}


def test_stock_configs_carry_no_adaptivespec_settings():
    configs, _ = select(["ar", "static", "ngram", "dynamic"], [0.5], DRAFT_PATH)
    for config in configs:
        assert config.engine_args()["additional_config"] is None
    assert next(c for c in configs if c.name == "ar").engine_args()["speculative_config"] is None


def test_dynamic_schedule_is_valid_for_vllm():
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    config = build(next(r for r in TABLE if r.name == "dynamic"), DRAFT_PATH)
    spec = config.speculative_config
    lookup = build_dynamic_sd_schedule_lookup(spec["num_speculative_tokens_per_batch_size"], 8,
                                              spec["num_speculative_tokens"])
    assert lookup[1] > lookup[8] > 0


def test_unknown_and_malformed_names_are_reported_and_the_rest_kept():
    configs, rejected = select(["ar", "bogus", "adaptive@2", "adaptive@x", "static-k4@0.5", "ar"], [0.5], DRAFT_PATH)
    assert [c.name for c in configs] == ["ar"]
    reasons = {r.name: r.reason for r in rejected}
    assert set(reasons) == {"bogus", "adaptive@2", "adaptive@x", "static-k4@0.5"}
    assert "unknown configuration 'bogus'" in reasons["bogus"] and "adaptive[@<tau>]" in reasons["bogus"]
    assert "(0, 1]" in reasons["adaptive@2"]
    assert "not a number" in reasons["adaptive@x"]
    assert "takes no tau" in reasons["static-k4@0.5"]


def test_selection_is_in_table_order_without_duplicates():
    configs, rejected = select(["adaptive@0.5", "all", "ar"], [0.9, 0.5], DRAFT_PATH)
    assert not rejected
    names = [c.name for c in configs]
    assert len(names) == len(set(names))
    assert names[0] == "ar" and names[-2:] == ["adaptive-tree@0.9", "adaptive-tree@0.5"]
    assert names.index("adaptive@0.9") + 1 == names.index("adaptive@0.5")


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), 1.5])
def test_tau_out_of_range_is_refused(tau):
    row = next(r for r in TABLE if r.name == "adaptive")
    with pytest.raises(ValueError):
        build(row, DRAFT_PATH, tau)


def test_suffix_row_is_vllms_suffix_method_with_its_settings():
    from vllm.config import SpeculativeConfig

    row = next(r for r in TABLE if r.name == "suffix")
    assert row.kind == "suffix" and row.needs == "arctic_inference.suffix_decoding" and row.depth is None
    spec = row.speculative
    assert spec["method"] == "suffix" and spec["num_speculative_tokens"] == 8
    fields = SpeculativeConfig.__dataclass_fields__
    for key, value in spec.items():  # every key is one vLLM 0.32 accepts; the suffix settings are its defaults
        assert key in fields, key
        if key.startswith("suffix_decoding_"):
            assert fields[key].default == value, key


def test_suffix_runs_where_arctic_inference_imports_and_is_rejected_with_the_reason_elsewhere(monkeypatch):
    from vllm_adaptivespec.bench import configs

    monkeypatch.setattr(configs, "missing_module", lambda module: None)
    chosen, rejected = select(["suffix", "ar"], [], DRAFT_PATH)  # the kind: both ceilings
    assert [c.name for c in chosen] == ["ar", "suffix", "suffix-k24"] and not rejected
    (suffix,) = [c for c in chosen if c.name == "suffix"]
    assert suffix.engine_args() == {"speculative_config": configs.SUFFIX, "additional_config": None}
    assert not suffix.needs_drafter and suffix.kind in configs.STOCK_KINDS
    (default,) = [c for c in chosen if c.name == "suffix-k24"]
    assert default.speculative_config == {**configs.SUFFIX, "num_speculative_tokens": 24}

    monkeypatch.setattr(configs, "missing_module", lambda module: f"needs {module}; importing it failed")
    for names in (["suffix", "ar"], ["all"], ["ar", "suffix@0.5"]):
        chosen, rejected = select(names, [0.5], DRAFT_PATH)
        assert "suffix" not in {c.name for c in chosen} and "ar" in {c.name for c in chosen}
        reasons = {r.name: r.reason for r in rejected}
        assert list(reasons) == (["suffix", "suffix-k24"] if names != ["ar", "suffix@0.5"] else ["suffix@0.5"])
    chosen, rejected = select(["all"], [0.5], DRAFT_PATH)
    assert rejected[0].reason == "needs arctic_inference.suffix_decoding; importing it failed"
    assert len(chosen) == len(TABLE) - 2  # the rest of "all" still runs (one tau: one configuration a row)


def test_missing_module_names_the_package_and_the_import_error():
    from vllm_adaptivespec.bench.configs import missing_module

    assert missing_module("json") is None
    reason = missing_module("vllm_adaptivespec_no_such_module")
    assert "importing vllm_adaptivespec_no_such_module failed: ModuleNotFoundError" in reason


def test_overrides_change_only_the_named_adaptivespec_settings_and_bad_ones_fail_naming_the_field():
    from vllm_adaptivespec.bench.configs import build_with_overrides

    plain = build_with_overrides("policy-only", DRAFT_PATH)
    assert plain == build(next(r for r in TABLE if r.name == "policy-only"), DRAFT_PATH)
    changed = build_with_overrides("policy-only+allow_off=false+max_depth=4", DRAFT_PATH)
    assert changed.name == "policy-only+allow_off=false+max_depth=4"
    assert changed.adaptivespec == {**plain.adaptivespec, "allow_off": False, "max_depth": 4}
    assert changed.speculative_config == plain.speculative_config
    with pytest.raises(ValueError, match="max_depht"):
        build_with_overrides("policy-only+max_depht=4", DRAFT_PATH)
    with pytest.raises(ValueError, match="max_depth"):
        build_with_overrides("policy-only+max_depth=0", DRAFT_PATH)
    with pytest.raises(ValueError, match="no settings"):
        build_with_overrides("static-k2+tau=0.5", DRAFT_PATH)
    with pytest.raises(ValueError, match="unknown configuration"):
        build_with_overrides("nope", DRAFT_PATH)
    swept = build_with_overrides("adaptive@0.5+max_depth=4", DRAFT_PATH)
    assert swept.tau == 0.5 and swept.adaptivespec["tau"] == 0.5 and swept.adaptivespec["max_depth"] == 4
    with pytest.raises(ValueError, match="swept over tau"):
        build_with_overrides("adaptive", DRAFT_PATH)
    # k: vLLM's num_speculative_tokens, of any speculative row
    deeper = build_with_overrides("policy-only+k=24+max_depth=24", DRAFT_PATH)
    assert deeper.speculative_config == {**plain.speculative_config, "num_speculative_tokens": 24}
    assert deeper.adaptivespec == {**plain.adaptivespec, "max_depth": 24}
    k2 = build(next(r for r in TABLE if r.name == "static-k2"), DRAFT_PATH)
    static = build_with_overrides("static-k2+k=3", DRAFT_PATH)
    assert static.speculative_config == {**k2.speculative_config, "num_speculative_tokens": 3}
    assert static.depth == 3 and static.adaptivespec is None
    with pytest.raises(ValueError, match="does not speculate"):
        build_with_overrides("ar+k=4", DRAFT_PATH)
    with pytest.raises(ValueError, match="positive integer"):
        build_with_overrides("static-k2+k=0", DRAFT_PATH)
