"""Ratios within a run, the Markdown table and the PNG plots, from synthetic cells."""

from __future__ import annotations

import pytest

from vllm_adaptivespec.bench.plots import draw_all
from vllm_adaptivespec.bench.report import derive, markdown

CONFIGS = [  # name, row, kind, tau, tok/s, pass@1
    ("ar", "ar", "ar", None, 10.0, 0.5),
    ("static-k2", "static-k2", "static", None, 14.0, 0.5),
    ("static-k4", "static-k4", "static", None, 16.0, 0.5),
    ("ngram", "ngram", "ngram", None, 20.0, 0.5),
    ("policy-only", "policy-only", "adaptivespec", 1.0, 18.0, 0.5),
    ("margin-k4@0.5", "margin-k4", "adaptivespec", 0.5, 20.0, 0.45),
    ("adaptive@0.9", "adaptive", "adaptivespec", 0.9, 19.0, 0.5),
    ("adaptive@0.5", "adaptive", "adaptivespec", 0.5, 24.0, 0.4),
]


def _cell(name, row, kind, tau, speed, accuracy, workload="humaneval", batch=1):
    cell = {"config": name, "row": row, "kind": kind, "tau": tau, "depth": None, "workload": workload,
            "batch": batch, "temperature": 0.0, "status": "ok", "tokens_per_s": speed,
            "spec": {"mean_acceptance_length": 2.5, "draft_tokens_per_step": 4.0},
            "step_latency_ms": {"p50": 30.0, "p99": 60.0},
            "accuracy": {"metric": "pass@1", "value": accuracy, "correct": int(accuracy * 10), "n": 10},
            "adaptivespec": {}}
    if kind == "adaptivespec":
        cell["adaptivespec"] = {
            "promoted_tokens": {"type": "counter", "value": 7},
            "draft_depth": {"type": "histogram", "count": 10, "sum": 35.0,
                            "buckets": {"0.0": 0, "1.0": 1, "2.0": 3, "4.0": 7, "8.0": 10, "+Inf": 10}},
        }
    return cell


@pytest.fixture
def data():
    cells = [_cell(*c) for c in CONFIGS]
    cells += [_cell(*c, workload="general", batch=8) for c in CONFIGS]
    cells.append({"config": "static-k8", "row": "static-k8", "kind": "static", "workload": "humaneval",
                  "batch": 1, "temperature": 0.0, "status": "failed", "error": "RuntimeError: boom | bad"})
    return {"command": "adaptivespec bench --mode quick", "configs": {c[0]: {} for c in CONFIGS},
            "rejected_configs": [{"name": "bogus", "reason": "unknown configuration 'bogus'"}],
            "environment": {"vllm": "0.32.0", "hardware": {"cpu": "test", "gpus": []}},
            "models": {"pair": "qwen-coder", "target": "/t", "drafter": "/d"}, "settings": {"mode": "quick"},
            "cells": cells}


def test_ratios_are_taken_within_the_same_cell_group(data):
    derive(data)
    cell = next(c for c in data["cells"] if c["config"] == "adaptive@0.5" and c["workload"] == "humaneval")
    assert cell["derived"]["speedup_vs_ar"] == pytest.approx(2.4)
    assert cell["derived"]["speedup_vs_best_static"] == pytest.approx(24 / 16)
    assert cell["derived"]["best_static"] == "static-k4"
    assert cell["derived"]["speedup_vs_best_stock"] == pytest.approx(24 / 20)  # n-gram beats every static k
    assert cell["derived"]["best_stock"] == "ngram"
    assert cell["derived"]["accuracy_recovery"] == pytest.approx(0.8)
    failed = next(c for c in data["cells"] if c["status"] == "failed")
    assert "derived" not in failed


def test_markdown_has_one_table_per_group_and_reports_problems(data):
    derive(data)
    text = markdown(data)
    assert "## humaneval, batch 1, temperature 0" in text and "## general, batch 8, temperature 0" in text
    assert "| `adaptive@0.5` | 24.0 | 2.40x | 1.50x | 1.20x | 2.50 | 4.00 | 30.0 | 60.0 | 40% (4/10) | 80% |" in text
    assert "`bogus`: unknown configuration" in text
    assert "**failed**: RuntimeError: boom / bad" in text  # a '|' would break the table
    assert "## Warnings" not in text  # every AdaptiveSpec cell recorded depths


def test_adaptivespec_cells_without_plugin_metrics_are_flagged(data):
    for cell in data["cells"]:
        if cell["config"] == "adaptive@0.9":
            cell["adaptivespec"] = {}
    derive(data)
    assert "no `vllm:adaptivespec_draft_depth` observations" in markdown(data)


def test_plots_are_written_as_png(data, tmp_path):
    derive(data)
    made = draw_all(data, tmp_path / "plots")
    assert sorted(p.name for p in made) == ["draft_depth_distribution.png", "pass_at_1_vs_tau.png",
                                                "speed_by_config.png", "speed_vs_tau.png"]
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plots_skip_what_has_no_data(tmp_path):
    data = {"cells": [_cell("ar", "ar", "ar", None, 10.0, 0.5, workload="general")]}
    derive(data)
    made = draw_all(data, tmp_path / "plots")
    assert [p.name for p in made] == ["speed_by_config.png", "speed_vs_tau.png"]
