"""Per-request state does not outlive its request: a soak of many short and many aborted requests through
one AdaptiveSpec engine (benchmarks/soak.py, in its own process; tiny models, speculation always on).

Checked at every snapshot (each taken right after a request finished): the plugin's per-request tables
(`AdaptiveState` dicts, its `PolicyBank`) hold at most the request just finished (it is freed with the
next scheduled step, as vLLM's own runner table is), its histories stay at their caps, no Prometheus
label set is added, and neither Python objects nor RSS grow with the number of requests. The full-size
run (2,000 requests and 500 aborted, with stock-vLLM and plain-decoding baselines for the RSS figures)
is committed under benchmarks/results/soak-tiny.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
REQUESTS, ABORTED, EVERY = 1000, 250, 250
MAX_NUM_SEQS = 4  # benchmarks/soak.py's engine


@pytest.fixture(scope="module")
def soak():
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE_TEST", "1")}
    args = ["--requests", str(REQUESTS), "--aborted", str(ABORTED), "--every", str(EVERY)]
    proc = subprocess.run([sys.executable, str(SOAK), *args], capture_output=True, text=True, timeout=540, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("SOAK_RESULT "):
            return json.loads(line[len("SOAK_RESULT ") :])
    pytest.fail(f"soak exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")


def test_soak_ran_every_request_with_drafts_and_promotions(soak):
    assert soak["requests"] == REQUESTS and soak["aborted"] == ABORTED
    assert [p["requests"] for p in soak["points"][1:-1]] == list(range(EVERY, REQUESTS + 1, EVERY))
    assert soak["metrics"]["vllm:spec_decode_num_accepted_tokens"] > 0
    assert soak["metrics"]["vllm:adaptivespec_promoted_tokens"] > 0


def test_per_request_state_returns_to_the_last_request(soak):
    """At most one entry per table (the request that just finished), however many requests ran or were
    aborted; vLLM's own runner table, freed by the same scheduler message, shows the same lag."""
    for point in soak["points"][1:]:
        assert max(point["per_request"].values()) <= 1, point
        assert point["vllm_per_request"]["runner_requests"] <= 1, point
        assert point["vllm_per_request"]["scheduler_requests"] == point["vllm_per_request"]["output_states"] == 0


def test_histories_stay_bounded(soak):
    """The pooled-acceptance window at its cap, the cost model's buckets at a few powers of two of batch
    tokens (max_num_seqs * (1 + depth) at most for decode steps, prompts up to 24 tokens), the calibration
    at its bins; the hindsight step log stays off unless asked for."""
    last = soak["points"][-1]["histories"]
    for point in soak["points"][1:]:
        h = point["histories"]
        assert h["pooled_window"] <= 64 and h.get("free_pooled_window", 0) <= 64
        assert h["target_cost_buckets"] <= 8 and h["draft_pass_buckets"] <= 8
        assert h["calibration_bins"] == 10 and h["step_log"] == 0
    assert last["calibration_judged"] > REQUESTS  # it kept learning: the bounds are not from idleness


def test_no_metric_label_set_per_request(soak):
    """The spec-decode and AdaptiveSpec metric families hold the same samples after every request as
    before the first (labels per engine, none per request)."""
    samples = {p["metric_samples"] for p in soak["points"]}
    assert len(samples) == 1 and samples.pop() > 0


def test_objects_and_rss_do_not_grow_with_requests(soak):
    """Python objects (those created after vLLM's start-up gc.freeze) stay under twice the warm figure.
    RSS is a coarse guard only (the tables above are the fine one): vLLM itself creeps, fastest early on
    (full runs in benchmarks/results/soak-tiny: 68-92 KiB per request between 250 and 500 requests,
    19-30 KiB between 1,000 and 2,000, the same with stock speculation and with none), so the bound is
    160 KiB per request over the second half of the run and 192 MiB after warm-up in all: it catches a
    leak of more than about 100 KiB per request, the tables anything that keeps a request's entry."""
    points = soak["points"]
    warm, half, end = points[1], points[len(points) // 2], points[-1]
    assert end["gc_objects"] <= 2 * warm["gc_objects"], (warm["gc_objects"], end["gc_objects"])
    handled = (end["requests"] + end["aborted"]) - (half["requests"] + half["aborted"])
    assert handled > 0
    per_request_kib = (end["rss_mib"] - half["rss_mib"]) * 1024 / handled
    assert per_request_kib < 160, f"RSS grew {per_request_kib:.1f} KiB per request"
    assert end["rss_mib"] - warm["rss_mib"] < 192, (warm["rss_mib"], end["rss_mib"])
