"""vLLM's Prometheus metrics as plain dicts: snapshots, per-cell deltas and the figures derived from them.

Counters are summed over label sets (one engine per process here). A cell's figures come from the
difference of the snapshots taken before and after it, so the warm-up and earlier cells do not count.
vLLM's reader rounds counters down to whole numbers; `exact_counters` reads AdaptiveSpec's straight
from the Prometheus registry, so a counter of seconds keeps its fractions.
"""

from __future__ import annotations

SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
ADAPTIVESPEC_PREFIX = "vllm:adaptivespec_"
# Exported as vllm:adaptivespec_overhead_seconds_total; Prometheus names the counter without "_total".
OVERHEAD = "vllm:adaptivespec_overhead_seconds"
WANTED_PREFIXES = ("vllm:spec_decode_", ADAPTIVESPEC_PREFIX)


def exact_counters(registry=None) -> dict[str, float]:
    """AdaptiveSpec's counters from the Prometheus registry (the process's own by default), unrounded."""
    if registry is None:
        from prometheus_client import REGISTRY as registry
    return {metric.name: sum(s.value for s in metric.samples if s.name == metric.name + "_total")
            for metric in registry.collect()
            if metric.type == "counter" and metric.name.startswith(ADAPTIVESPEC_PREFIX)}


def snapshot(metrics: list, exact: dict[str, float] | None = None) -> dict[str, dict]:
    """vLLM `Metric` objects (``llm.get_metrics()``) -> {name: counter/vector/histogram/gauge dict};
    counters in ``exact`` (see `exact_counters`) take its values (whole numbers stay ints)."""
    out: dict[str, dict] = {}
    for metric in metrics:
        name = metric.name
        if not name.startswith(WANTED_PREFIXES):
            continue
        if hasattr(metric, "buckets"):
            entry = out.setdefault(name, {"type": "histogram", "count": 0, "sum": 0.0, "buckets": {}})
            entry["count"] += metric.count
            entry["sum"] += metric.sum
            for le, count in metric.buckets.items():
                entry["buckets"][le] = entry["buckets"].get(le, 0) + count
        elif hasattr(metric, "values"):
            entry = out.setdefault(name, {"type": "vector", "values": []})
            entry["values"] = _combine(entry["values"], list(metric.values), 1)
        elif type(metric).__name__ == "Counter":
            entry = out.setdefault(name, {"type": "counter", "value": 0})
            entry["value"] += metric.value
        elif type(metric).__name__ == "Gauge":
            out[name] = {"type": "gauge", "value": metric.value}
    for name, value in (exact or {}).items():
        out[name] = {"type": "counter", "value": int(value) if float(value).is_integer() else value}
    return out


def delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, now in after.items():
        was = before.get(name)
        if now["type"] == "counter":
            out[name] = {"type": "counter", "value": now["value"] - (was["value"] if was else 0)}
        elif now["type"] == "gauge":  # a level, not a count: the value at the end of the cell
            out[name] = dict(now)
        elif now["type"] == "vector":
            out[name] = {"type": "vector", "values": _combine(now["values"], was["values"] if was else [], -1)}
        else:
            old_buckets = was["buckets"] if was else {}
            out[name] = {
                "type": "histogram",
                "count": now["count"] - (was["count"] if was else 0),
                "sum": now["sum"] - (was["sum"] if was else 0.0),
                "buckets": {le: c - old_buckets.get(le, 0) for le, c in now["buckets"].items()},
            }
    return out


def _combine(a: list[int], b: list[int], sign: int) -> list[int]:
    """Element-wise a + sign * b, the shorter list padded with zeros."""
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + sign * (b[i] if i < len(b) else 0) for i in range(n)]


def _counter(d: dict[str, dict], name: str) -> int:
    entry = d.get(name)
    return int(entry["value"]) if entry and entry["type"] == "counter" else 0


def spec_figures(d: dict[str, dict]) -> dict:
    """Acceptance length (tokens emitted per verification step, bonus token included) and
    draft tokens per step, per request-step, from vLLM's spec-decode counters."""
    drafts = _counter(d, SPEC_DRAFTS)
    draft_tokens = _counter(d, SPEC_DRAFT_TOKENS)
    accepted = _counter(d, SPEC_ACCEPTED)
    per_pos = d.get(SPEC_ACCEPTED_PER_POS, {}).get("values", [])
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "accepted_per_position": per_pos,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "draft_tokens_per_step": draft_tokens / drafts if drafts else 0.0,
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
    }


def adaptivespec_figures(d: dict[str, dict]) -> dict[str, dict]:
    """The plugin's own metrics (``vllm:adaptivespec_*``), if it exported any."""
    return {name[len(ADAPTIVESPEC_PREFIX):]: entry for name, entry in d.items() if name.startswith(ADAPTIVESPEC_PREFIX)}


def overhead_figures(d: dict[str, dict], step_seconds_total: float) -> dict:
    """Seconds of the plugin's own per-step work over the cell and their share of all its step time;
    None for both when the engine exports no overhead counter."""
    entry = d.get(OVERHEAD)
    if not entry or entry["type"] != "counter":
        return {"overhead_seconds": None, "overhead_share": None}
    seconds = float(entry["value"])
    return {"overhead_seconds": seconds,
            "overhead_share": seconds / step_seconds_total if step_seconds_total > 0 else None}


def histogram_distribution(entry: dict) -> list[tuple[str, int]]:
    """Cumulative Prometheus buckets -> per-bucket counts ``[(upper bound, count), ...]`` without empty tails."""
    def key(le: str) -> float:
        return float("inf") if le in ("+Inf", "inf") else float(le)

    counts, previous = [], 0
    for le in sorted(entry["buckets"], key=key):
        cumulative = entry["buckets"][le]
        counts.append((le, cumulative - previous))
        previous = cumulative
    while counts and counts[-1][1] == 0:
        counts.pop()
    return counts


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]) of an unsorted list; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
