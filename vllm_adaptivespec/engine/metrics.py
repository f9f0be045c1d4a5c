"""AdaptiveSpec metrics on vLLM's own Prometheus endpoint and spec-decode log line.

Path of a step's numbers: worker (`StepStats` on the ModelRunnerOutput) -> scheduler (copied into
that step's `SpecDecodingStats`, which vLLM already ships to the front end) -> front end
(`SpecDecodingProm` counters/histogram, `SpecDecodingLogging` line). `SpecDecodingStats` gets two
extra dataclass fields in every process before any msgpack decoder is built, so they travel with it.
"""

from __future__ import annotations

import numpy as np
import prometheus_client
from vllm.v1.spec_decode import metrics as vllm_sd_metrics
from vllm.v1.metrics.utils import create_metric_per_engine

from vllm_adaptivespec.engine.patching import DataclassFields, VllmPatch

PROMOTED = "vllm:adaptivespec_promoted_tokens"
DEPTH = "vllm:adaptivespec_draft_depth"
DRAFT_COST = "vllm:adaptivespec_draft_cost"
OVERHEAD = "vllm:adaptivespec_overhead_seconds"
FREE = "vllm:adaptivespec_free_draft_tokens"
STEP_PROMOTIONS = "vllm:adaptivespec_request_step_promotions"
DRAFTER_PASSES = "vllm:adaptivespec_drafter_passes"
_EXTRA_FIELDS = {
    "adaptivespec_overhead_seconds": (float, 0.0),
    "adaptivespec_promoted": (int, 0),
    "adaptivespec_free_tokens": (int, 0),
    "adaptivespec_drafter_passes": (int, 0),
    "adaptivespec_depth_counts": (list[int], None),
    "adaptivespec_promotion_counts": (list[int], None),
    "adaptivespec_draft_cost": (float, -1.0),  # -1: not known in this step
}


# Our fields on vLLM's SpecDecodingStats dataclass (msgspec then encodes/decodes them).
STATS_FIELDS = DataclassFields(
    vllm_sd_metrics.SpecDecodingStats, _EXTRA_FIELDS, "carry AdaptiveSpec step stats to the front end"
)


def add_step_stats(spec_decoding_stats, step) -> None:
    """Scheduler side: fold one step's worker stats into the step's SpecDecodingStats."""
    spec_decoding_stats.adaptivespec_promoted = spec_decoding_stats.adaptivespec_promoted + step.promoted
    spec_decoding_stats.adaptivespec_overhead_seconds += step.overhead_seconds
    spec_decoding_stats.adaptivespec_free_tokens += step.free_tokens
    spec_decoding_stats.adaptivespec_drafter_passes += step.drafter_passes
    spec_decoding_stats.adaptivespec_depth_counts = _summed(
        spec_decoding_stats.adaptivespec_depth_counts, step.depth_counts)
    spec_decoding_stats.adaptivespec_promotion_counts = _summed(
        spec_decoding_stats.adaptivespec_promotion_counts, step.promotion_counts)
    if step.draft_cost is not None:
        spec_decoding_stats.adaptivespec_draft_cost = step.draft_cost


def _summed(counts: list[int] | None, more: list[int]) -> list[int]:
    """Two by-index histograms added, the shorter one padded with zeros."""
    total = list(counts or [])
    total.extend([0] * (len(more) - len(total)))
    for i, n in enumerate(more):
        total[i] += n
    return total


class SpecDecodingPromPatch(VllmPatch[vllm_sd_metrics.SpecDecodingProm]):
    """Prometheus counters, histogram and gauge beside vLLM's spec-decode ones."""

    def __init__(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs):
        """create AdaptiveSpec counters beside vLLM's spec-decode counters"""
        stock = SpecDecodingPromPatch.stock
        stock.__init__(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs)
        self.adaptivespec_promoted = None
        if not self.spec_decoding_enabled or speculative_config is None:
            return
        self.adaptivespec_promoted = create_metric_per_engine(
            prometheus_client.Counter(
                name=PROMOTED,
                documentation="Draft tokens accepted by AdaptiveSpec's margin rule that strict "
                "verification would have rejected.",
                labelnames=labelnames,
            ),
            per_engine_labelvalues,
        )
        self.adaptivespec_overhead = create_metric_per_engine(
            prometheus_client.Counter(
                name=OVERHEAD,
                documentation="Seconds AdaptiveSpec spent on its own per-step work (policy, draft and tree "
                "bookkeeping, margin verification beyond vLLM's rejection sampler).",
                labelnames=labelnames,
            ),
            per_engine_labelvalues,
        )
        self.adaptivespec_free = create_metric_per_engine(
            prometheus_client.Counter(
                name=FREE,
                documentation="Draft tokens AdaptiveSpec copied from the requests' own prompt and output "
                "(the free draft source: no drafter pass).",
                labelnames=labelnames,
            ),
            per_engine_labelvalues,
        )
        self.adaptivespec_drafter_passes = create_metric_per_engine(
            prometheus_client.Counter(
                name=DRAFTER_PASSES,
                documentation="Forward passes of the drafter model AdaptiveSpec ran (a step that drafted only "
                "copies, or none, ran none).",
                labelnames=labelnames,
            ),
            per_engine_labelvalues,
        )
        max_depth = int(speculative_config.num_speculative_tokens)
        self.adaptivespec_depth = create_metric_per_engine(
            prometheus_client.Histogram(
                name=DEPTH,
                documentation="Draft depth AdaptiveSpec's policy chose per request and step.",
                labelnames=labelnames,
                buckets=[float(d) for d in range(max_depth + 1)],
            ),
            per_engine_labelvalues,
        )
        self.adaptivespec_step_promotions = create_metric_per_engine(
            prometheus_client.Histogram(
                name=STEP_PROMOTIONS,
                documentation="Margin promotions in one request's verified draft, per request and step "
                "(bounded by max_promotions_per_step).",
                labelnames=labelnames,
                buckets=[float(n) for n in range(max_depth + 1)],
            ),
            per_engine_labelvalues,
        )
        self.adaptivespec_draft_cost = create_metric_per_engine(
            prometheus_client.Gauge(
                name=DRAFT_COST,
                documentation="Drafter pass time / target forward time the policy prices depth with "
                "(measured online, or the configured draft_cost).",
                labelnames=labelnames,
                multiprocess_mode="mostrecent",
            ),
            per_engine_labelvalues,
        )

    def observe(self, spec_decoding_stats, engine_idx=0, *args, **kwargs):
        """feed AdaptiveSpec counters from the step's SpecDecodingStats"""
        SpecDecodingPromPatch.stock.observe(self, spec_decoding_stats, engine_idx, *args, **kwargs)
        if getattr(self, "adaptivespec_promoted", None) is None:
            return
        self.adaptivespec_promoted[engine_idx].inc(spec_decoding_stats.adaptivespec_promoted)
        self.adaptivespec_overhead[engine_idx].inc(spec_decoding_stats.adaptivespec_overhead_seconds)
        self.adaptivespec_free[engine_idx].inc(spec_decoding_stats.adaptivespec_free_tokens)
        self.adaptivespec_drafter_passes[engine_idx].inc(spec_decoding_stats.adaptivespec_drafter_passes)
        for histogram, counts in ((self.adaptivespec_depth[engine_idx], spec_decoding_stats.adaptivespec_depth_counts),
                                  (self.adaptivespec_step_promotions[engine_idx],
                                   spec_decoding_stats.adaptivespec_promotion_counts)):
            for value, n in enumerate(counts or []):
                for _ in range(n):
                    histogram.observe(value)
        if spec_decoding_stats.adaptivespec_draft_cost >= 0:
            self.adaptivespec_draft_cost[engine_idx].set(spec_decoding_stats.adaptivespec_draft_cost)


class SpecDecodingLoggingPatch(VllmPatch[vllm_sd_metrics.SpecDecodingLogging]):
    """The extra AdaptiveSpec figures on vLLM's periodic spec-decode log line."""

    def reset(self):
        """also reset AdaptiveSpec's log-line accumulators"""
        SpecDecodingLoggingPatch.stock.reset(self)
        self.adaptivespec_promoted = 0
        self.adaptivespec_free_tokens = 0
        self.adaptivespec_depth_counts = np.zeros(0, dtype=np.int64)
        self.adaptivespec_draft_cost = -1.0

    def observe(self, spec_decoding_stats):
        """accumulate AdaptiveSpec figures for the periodic log line"""
        SpecDecodingLoggingPatch.stock.observe(self, spec_decoding_stats)
        self.adaptivespec_promoted += spec_decoding_stats.adaptivespec_promoted
        self.adaptivespec_free_tokens += spec_decoding_stats.adaptivespec_free_tokens
        if spec_decoding_stats.adaptivespec_draft_cost >= 0:
            self.adaptivespec_draft_cost = spec_decoding_stats.adaptivespec_draft_cost
        if spec_decoding_stats.adaptivespec_depth_counts:
            self.adaptivespec_depth_counts = np.asarray(
                _summed(self.adaptivespec_depth_counts.tolist(), spec_decoding_stats.adaptivespec_depth_counts),
                dtype=np.int64)

    def log(self, log_fn=vllm_sd_metrics.logger.info):
        """append AdaptiveSpec figures to vLLM's spec-decode log line"""
        promoted, counts, free = self.adaptivespec_promoted, self.adaptivespec_depth_counts, self.adaptivespec_free_tokens
        draft_cost = self.adaptivespec_draft_cost
        had_drafts = bool(self.num_drafts)
        SpecDecodingLoggingPatch.stock.log(self, log_fn)
        if had_drafts and counts.size:
            mean_depth = float((counts * np.arange(counts.size)).sum() / max(counts.sum(), 1))
            log_fn(
                "AdaptiveSpec metrics: Margin-promoted tokens: %d, Free draft tokens: %d, Mean chosen depth: %.2f, "
                "Depth histogram: %s, Draft cost: %.3f",
                promoted,
                free,
                mean_depth,
                counts.tolist(),
                draft_cost,
            )
