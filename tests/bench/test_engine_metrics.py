"""vLLM metric snapshots -> per-cell deltas -> acceptance length, draft tokens per step, depths, overhead."""

from __future__ import annotations

import pytest
from vllm.v1.metrics.reader import Counter, Gauge, Histogram, Vector

from vllm_adaptivespec.bench.engine_metrics import (
    OVERHEAD, adaptivespec_figures, delta, exact_counters, histogram_distribution, overhead_figures, percentile,
    snapshot, spec_figures,
)

LABELS = {"model_name": "m", "engine": "0"}


def _metrics(drafts, draft_tokens, accepted, per_pos, depth_buckets, promoted, draft_cost=0.3):
    return [
        Counter("vllm:spec_decode_num_drafts", LABELS, drafts),
        Counter("vllm:spec_decode_num_draft_tokens", LABELS, draft_tokens),
        Counter("vllm:spec_decode_num_accepted_tokens", LABELS, accepted),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", LABELS, per_pos),
        Counter("vllm:adaptivespec_promoted_tokens", LABELS, promoted),
        Histogram("vllm:adaptivespec_draft_depth", LABELS, count=depth_buckets["+Inf"], sum=0.0,
                  buckets=depth_buckets),
        Gauge("vllm:adaptivespec_draft_cost", LABELS, draft_cost),
        Counter("vllm:generation_tokens", LABELS, 999),  # not ours: ignored
        Gauge("vllm:num_requests_running", LABELS, 3.0),
    ]


def test_cell_figures_come_from_the_difference_of_two_snapshots():
    before = snapshot(_metrics(10, 40, 20, [8, 6, 4, 2], {"1.0": 2, "2.0": 5, "4.0": 10, "+Inf": 10}, 1))
    after = snapshot(_metrics(30, 100, 70, [25, 20, 15, 10], {"1.0": 2, "2.0": 9, "4.0": 30, "+Inf": 30}, 6, 0.42))
    counts = delta(before, after)
    figures = spec_figures(counts)
    assert figures["num_drafts"] == 20 and figures["num_draft_tokens"] == 60
    assert figures["mean_acceptance_length"] == 1 + 50 / 20
    assert figures["draft_tokens_per_step"] == 3.0
    assert figures["accepted_per_position"] == [17, 14, 11, 8]
    ours = adaptivespec_figures(counts)
    assert ours["promoted_tokens"]["value"] == 5
    assert ours["draft_cost"] == {"type": "gauge", "value": 0.42}  # a level: the latest value, not a difference
    assert histogram_distribution(ours["draft_depth"]) == [("1.0", 0), ("2.0", 4), ("4.0", 16)]
    assert "vllm:generation_tokens" not in counts


def test_no_speculation_means_acceptance_length_one():
    figures = spec_figures(delta({}, snapshot([])))
    assert figures["mean_acceptance_length"] == 1.0 and figures["draft_tokens_per_step"] == 0.0
    assert figures["draft_acceptance_rate"] is None


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(101)), 99) == 99.0


def test_exact_counters_keep_the_overhead_seconds_vllms_reader_rounds_down():
    from prometheus_client import CollectorRegistry
    from prometheus_client import Counter as PromCounter

    registry = CollectorRegistry()
    overhead = PromCounter("vllm:adaptivespec_overhead_seconds_total", "plugin seconds", ["engine"], registry=registry)
    promoted = PromCounter("vllm:adaptivespec_promoted_tokens", "promoted", ["engine"], registry=registry)
    PromCounter("vllm:spec_decode_num_drafts", "not ours", registry=registry).inc(3)
    assert set(exact_counters(registry)) == {OVERHEAD, "vllm:adaptivespec_promoted_tokens"}
    overhead.labels("0").inc(0.25)
    promoted.labels("0").inc(4)
    before = snapshot([Counter(OVERHEAD, LABELS, 0)], exact_counters(registry))
    overhead.labels("0").inc(0.5)
    promoted.labels("0").inc(2)
    after = snapshot([Counter(OVERHEAD, LABELS, 0)], exact_counters(registry))  # vLLM's reader gave int(0.75) = 0
    counts = delta(before, after)
    assert counts[OVERHEAD]["value"] == pytest.approx(0.5)
    assert counts["vllm:adaptivespec_promoted_tokens"] == {"type": "counter", "value": 2}  # whole numbers stay ints
    assert adaptivespec_figures(counts)["overhead_seconds"]["value"] == pytest.approx(0.5)
    assert overhead_figures(counts, 10.0) == {"overhead_seconds": 0.5, "overhead_share": pytest.approx(0.05)}
    assert overhead_figures(delta({}, snapshot([])), 10.0) == {"overhead_seconds": None, "overhead_share": None}
