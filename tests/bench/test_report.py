"""Ratios within a run, medians over repeats, the paired table, the Markdown and the PNG plots, from synthetic cells."""

from __future__ import annotations

import pytest

from vllm_adaptivespec.bench.plots import draw_all
from vllm_adaptivespec.bench.report import derive, markdown, mcnemar_p, paired_accuracy
from vllm_adaptivespec.bench.results import ResultStore

CONFIGS = [  # name, row, kind, tau, tok/s, pass@1
    ("ar", "ar", "ar", None, 10.0, 0.5),
    ("static-k1", "static-k1", "static", None, 12.0, 0.5),
    ("static-k2", "static-k2", "static", None, 14.0, 0.5),
    ("static-k3", "static-k3", "static", None, 15.0, 0.5),
    ("static-k4", "static-k4", "static", None, 16.0, 0.5),
    ("ngram", "ngram", "ngram", None, 20.0, 0.5),
    ("dynamic", "dynamic", "dynamic", None, 17.0, 0.5),
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
    assert cell["derived"]["accuracy_vs_lossless"] == pytest.approx(0.4 / 0.5)  # against policy-only, its twin
    margin = next(c for c in data["cells"] if c["config"] == "margin-k4@0.5" and c["workload"] == "humaneval")
    assert margin["derived"]["accuracy_vs_lossless"] == pytest.approx(0.45 / 0.5)  # against static-k4
    ar = next(c for c in data["cells"] if c["config"] == "ar" and c["workload"] == "humaneval")
    assert ar["derived"]["accuracy_vs_lossless"] is None
    failed = next(c for c in data["cells"] if c["status"] == "failed")
    assert "derived" not in failed


def test_no_best_stock_ratio_without_every_stock_configuration(data):
    data["cells"] = [c for c in data["cells"] if c["config"] != "static-k3"]
    derive(data)
    cell = next(c for c in data["cells"] if c["config"] == "adaptive@0.5" and c["workload"] == "humaneval")
    assert cell["derived"]["best_stock"] is None and cell["derived"]["speedup_vs_best_stock"] is None
    assert "| x best stock |" not in markdown(data)  # no such column (the legend still explains it)


def test_suffix_decoding_joins_best_stock_in_a_run_that_selected_it(data):
    data["configs"]["suffix"] = {"kind": "suffix", "row": "suffix"}
    data["cells"].append({"config": "suffix", "row": "suffix", "kind": "suffix", "workload": "humaneval", "batch": 1,
                          "temperature": 0.0, "status": "failed", "error": "engine failed"})
    derive(data)
    cell = next(c for c in data["cells"] if c["config"] == "adaptive@0.5" and c["workload"] == "humaneval")
    assert cell["derived"]["best_stock"] is None  # selected but not measured: best of a subset is not shown
    data["cells"][-1] = _cell("suffix", "suffix", "suffix", None, 22.0, 0.5)
    derive(data)
    cell = next(c for c in data["cells"] if c["config"] == "adaptive@0.5" and c["workload"] == "humaneval")
    assert cell["derived"]["best_stock"] == "suffix" and cell["derived"]["speedup_vs_best_stock"] == pytest.approx(24 / 22)
    del data["configs"]["suffix"]  # not selected (rejected where Arctic Inference is missing): the rest suffice
    data["cells"].pop()
    derive(data)
    cell = next(c for c in data["cells"] if c["config"] == "adaptive@0.5" and c["workload"] == "humaneval")
    assert cell["derived"]["best_stock"] == "ngram"


def test_copying_workloads_accuracy_is_shown(data):
    for cell in data["cells"]:
        if cell["workload"] == "general":
            cell["workload"] = "quote"
            cell["accuracy"] = {"metric": "quote_exact", "value": 0.75, "correct": 3, "n": 4}
    derive(data)
    assert "75% (3/4)" in markdown(data)


def test_markdown_has_one_table_per_group_and_reports_problems(data):
    derive(data)
    text = markdown(data)
    assert "## humaneval, batch 1, temperature 0" in text and "## general, batch 8, temperature 0" in text
    assert "| `adaptive@0.5` | 24.0 | 2.40x | 1.50x | 1.20x | 2.50 | 4.00 | 30.0 | 60.0 | 40% (4/10) | 80% |" in text
    assert "`bogus`: unknown configuration" in text
    assert "**failed**: RuntimeError: boom / bad" in text  # a '|' would break the table
    assert "## Warnings" not in text  # every AdaptiveSpec cell recorded depths


def test_math_accuracy_and_recovery_are_reported_and_general_is_not_graded(data, tmp_path):
    for name, row, kind, tau, speed, accuracy in CONFIGS:
        cell = _cell(name, row, kind, tau, speed, accuracy, workload="math")
        cell["accuracy"] = {"metric": "exact_match", "value": accuracy, "correct": int(accuracy * 20), "n": 20}
        data["cells"].append(cell)
    for cell in data["cells"]:
        if cell["workload"] == "general":  # a result of the old grading: 2 word problems by their last number
            cell["accuracy"] = {"metric": "word_problem_accuracy", "value": 0.0, "correct": 0, "n": 2}
    derive(data)
    math = next(c for c in data["cells"] if c["config"] == "adaptive@0.5" and c["workload"] == "math")
    assert math["derived"]["accuracy_recovery"] == pytest.approx(0.8)
    general = next(c for c in data["cells"] if c["config"] == "adaptive@0.5" and c["workload"] == "general")
    assert general["derived"]["accuracy_recovery"] is None
    text = markdown(data)
    assert "## math, batch 1, temperature 0" in text
    assert "| `adaptive@0.5` | 24.0 | 2.40x | 1.50x | 1.20x | 2.50 | 4.00 | 30.0 | 60.0 | 40% (8/20) | 80% |" in text
    general_table = text.split("## general, batch 8, temperature 0")[1].split("## ")[0]
    assert "0/2" not in general_table and "| – | – |" in general_table
    assert "exact-match share" in text and "not graded" in text
    made = {p.name for p in draw_all(data, tmp_path / "plots")}
    assert {"pass_at_1_vs_tau.png", "math_accuracy_vs_tau.png"} <= made


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
                                                "speed_by_config.png", "speed_vs_accuracy.png", "speed_vs_tau.png"]
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plots_skip_what_has_no_data(tmp_path):
    data = {"cells": [_cell("ar", "ar", "ar", None, 10.0, 0.5, workload="general")]}
    derive(data)
    made = draw_all(data, tmp_path / "plots")
    assert [p.name for p in made] == ["speed_by_config.png", "speed_vs_tau.png"]


def _measured(store, name, row, kind, speeds, p50s, workload="humaneval"):
    """One cell measured once per (tok/s, step p50) pair, through the result store as the runner writes it."""
    for repeat, (speed, p50) in enumerate(zip(speeds, p50s)):
        cell = _cell(name, row, kind, None, speed, 0.5, workload=workload)
        del cell["accuracy"]  # scored on the whole cell, not per repeat
        cell["step_latency_ms"] = {"p50": p50, "p99": 2 * p50}
        store.put_cell(cell, repeat=repeat)


@pytest.fixture
def rounds(tmp_path):
    store = ResultStore(tmp_path, {"configs": {n: {} for n in ("ar", "static-k2", "pinned-k2", "static-k4")},
                                   "settings": {"mode": "lean", "repeats": 3}, "cells": []})
    _measured(store, "ar", "ar", "ar", [5.0, 6.0, 4.0], [20.0, 20.0, 20.0])
    _measured(store, "static-k2", "static-k2", "static", [10.0, 12.0, 11.0], [30.0, 33.0, 31.0])
    _measured(store, "pinned-k2", "pinned-k2", "adaptivespec", [10.0, 11.5, 10.5], [31.0, 34.0, 31.0])
    _measured(store, "static-k4", "static-k4", "static", [9.0, 9.0], [40.0, 40.0])  # no pinned-k4: no pair
    return store.data


def test_cells_report_the_median_and_spread_of_their_repeats(rounds):
    derive(rounds)
    cell = next(c for c in rounds["cells"] if c["config"] == "static-k2")
    assert [r["tokens_per_s"] for r in cell["repeats"]] == [10.0, 12.0, 11.0]
    assert cell["tokens_per_s"] == 11.0 and cell["step_latency_ms"] == {"p50": 31.0, "p99": 62.0}
    assert cell["spread"]["tokens_per_s"] == {"min": 10.0, "max": 12.0, "rel": pytest.approx(0.2)}
    assert cell["spread"]["step_p50_ms"]["rel"] == pytest.approx(0.1)
    assert cell["derived"]["speedup_vs_ar"] == pytest.approx(11 / 5)  # ratios of medians
    assert cell["adaptivespec"] == {} and cell["n_repeats"] == 3
    pinned = next(c for c in rounds["cells"] if c["config"] == "pinned-k2")
    assert pinned["adaptivespec"]["promoted_tokens"] == {"type": "counter", "value": 7}
    text = markdown(rounds)
    # (a pinned/static pair alone is not the whole stock set: no best-stock column)
    assert "| `static-k2` | 11.0 | 20.0% | 2.20x | 1.00x | 2.50 | 4.00 | 31.0 | 10.0% | 62.0 |" in text
    assert "| `static-k4` | 9.0 | 0.0% |" in text and "repeats 3" in text


def test_paired_table_has_ratios_of_medians_and_of_each_round(rounds):
    derive(rounds)
    (pair,) = rounds["paired"]
    assert (pair["config"], pair["twin"], pair["workload"], pair["batch"]) == ("pinned-k2", "static-k2", "humaneval", 1)
    assert pair["step_p50_ratio"] == pytest.approx(31 / 31) and pair["tokens_per_s_ratio"] == pytest.approx(10.5 / 11)
    assert [r["repeat"] for r in pair["rounds"]] == [0, 1, 2]
    assert [r["step_p50_ratio"] for r in pair["rounds"]] == pytest.approx([31 / 30, 34 / 33, 1.0])
    assert [r["tokens_per_s_ratio"] for r in pair["rounds"]] == pytest.approx([1.0, 11.5 / 12, 10.5 / 11])
    assert pair["round_median"]["step_p50_ratio"] == pytest.approx(34 / 33)
    assert pair["round_median"]["tokens_per_s_ratio"] == pytest.approx(11.5 / 12)
    assert pair["overhead_share"] is None  # these cells recorded none
    text = markdown(rounds)
    assert "## Pinned AdaptiveSpec vs stock speculation of the same shape" in text
    assert ("| humaneval | 1 | 0 | `pinned-k2` / `static-k2` | 1.000 | 1.033, 1.030, 1.000 (median 1.030) | 0.955 | "
            "1.000, 0.958, 0.955 (median 0.958) | – |") in text


def test_a_round_that_failed_leaves_the_others_and_is_listed(rounds, tmp_path):
    store = ResultStore(tmp_path, rounds)
    failed = {k: v for k, v in _cell("pinned-k2", "pinned-k2", "adaptivespec", None, 0.0, 0.5).items()
              if k in ("config", "row", "kind", "tau", "depth", "workload", "batch", "temperature")}
    store.put_cell({**failed, "status": "failed", "error": "worker exited with status 3"}, repeat=1)
    derive(rounds)
    pinned = next(c for c in rounds["cells"] if c["config"] == "pinned-k2")
    assert pinned["status"] == "ok" and pinned["n_repeats"] == 2 and pinned["tokens_per_s"] == pytest.approx(10.25)
    assert not store.done("pinned-k2", "humaneval", 1, 0.0, 1) and store.done("pinned-k2", "humaneval", 1, 0.0, 2)
    (pair,) = rounds["paired"]
    assert [r["repeat"] for r in pair["rounds"]] == [0, 2]
    assert "round 2: failed: worker exited with status 3" in markdown(rounds)


def test_sustained_throughput_is_shown_where_a_cell_had_a_steady_stretch(data):
    derive(data)
    assert "| sustained tok/s |" not in markdown(data)  # no column: no cell had more prompts than its batch
    for cell in data["cells"]:
        if cell.get("status") == "ok":  # batch-1 cells too: they get no sustained figure (no drain to leave out)
            speed = 40.0 if cell["config"] == "ar" else 44.0
            cell["sustained"] = {"steps": 10, "tokens": 80, "seconds": 2.0, "tokens_per_s": speed}
    derive(data)
    policy = next(c for c in data["cells"] if c["config"] == "policy-only" and c["batch"] == 8)
    assert policy["derived"]["sustained_vs_ar"] == pytest.approx(1.1)
    batch1 = next(c for c in data["cells"] if c["config"] == "policy-only" and c["batch"] == 1)
    assert batch1["derived"]["sustained_vs_ar"] is None
    text = markdown(data)
    assert "| sustained tok/s | sustained x AR |" in text and "| 44.0 | 1.10x |" in text


def test_overhead_share_is_shown_for_plugin_rows(data):
    for cell in data["cells"]:
        if cell.get("kind") == "adaptivespec":
            cell.update(overhead_seconds=0.5, overhead_share=0.0312, step_seconds_total=16.0)
    derive(data)
    text = markdown(data)
    assert text.count("| overhead |") == 2 and "| tok/s spread |" not in text  # one repeat: no spread columns
    assert "| 7 | 3.1% |" in text and "| `ar` | 10.0 |" in text and "| – | – |" in text


def test_hindsight_table_lists_the_cells_that_have_one(data):
    cell = next(c for c in data["cells"] if c["config"] == "policy-only" and c["workload"] == "humaneval")
    cell["hindsight"] = {"policy": 9.0, "best_fixed": 9.5, "best_fixed_depth": 2, "oracle": 10.0, "regret": 0.1,
                         "fixed": [8.0, 9.0, 9.5], "steps": 100}
    derive(data)
    text = markdown(data)
    assert "## Policy vs hindsight" in text
    assert "| humaneval | 1 | 0 | `policy-only` | 9.0 | 9.5 (k=2) | 10.0 | 10.0% |" in text


def test_free_share_is_shown_once_the_plugin_counts_free_drafts(data):
    derive(data)
    assert "| free |" not in markdown(data)  # results of runs before free drafts existed
    for cell in data["cells"]:
        if cell.get("kind") == "adaptivespec":
            cell["spec"]["num_draft_tokens"] = 40
            cell["adaptivespec"]["free_draft_tokens"] = {"type": "counter", "value": 10}
    text = markdown(data)
    assert text.count("| free |") == 2 and "| 7 | 25% |" in text


def test_drafter_passes_per_token_are_shown_once_the_plugin_counts_them(data):
    from vllm_adaptivespec.bench.report import passes_per_token

    derive(data)
    assert "| passes/token |" not in markdown(data)  # results of runs before the plugin counted its passes
    for cell in (c for c in data["cells"] if c.get("status") == "ok"):
        cell["output_tokens"] = 200
        cell["step_latency_ms"] |= {"decode_steps": 90, "prefill_steps": 10}
        if cell.get("kind") == "static":
            cell["depth"] = int(cell["config"][-1])
        # Stock rows export the installed plugin's counters too, at zero.
        cell["adaptivespec"]["drafter_passes"] = {"type": "counter", "value": 50 if cell["kind"] == "adaptivespec" else 0}
    by_name = {c["config"]: c for c in data["cells"] if c.get("workload") == "humaneval" and c.get("status") == "ok"}
    assert passes_per_token(by_name["static-k3"]) == 3 * 100 / 200  # k passes every engine step
    assert passes_per_token(by_name["policy-only"]) == 50 / 200  # the plugin's own count
    assert passes_per_token(by_name["ngram"]) == 0.0 and passes_per_token(by_name["ar"]) == 0.0
    assert passes_per_token(by_name["dynamic"]) is None  # k changes with the batch: not known
    text = markdown(data)
    assert "| passes/token |" in text and "| 1.50 |" in text and "| 0.25 |" in text


def test_paired_accuracy_counts_each_problem_against_the_target_and_the_lossless_twin(data):
    failures = {"ar": {"p1", "p2", "p3"}, "policy-only": {"p1", "p2"}, "adaptive@0.5": {"p1", "p4", "p5", "p6"}}
    for cell in data["cells"]:
        if cell["workload"] == "humaneval" and cell["config"] in failures:
            cell["accuracy"].update(failures=dict.fromkeys(failures[cell["config"]], "wrong"), n=10)
    derive(data)
    pairs = {(p["config"], p["reference"]): p for p in paired_accuracy(data)}
    assert set(pairs) == {("policy-only", "ar"), ("adaptive@0.5", "ar"), ("adaptive@0.5", "policy-only")}
    vs_twin = pairs[("adaptive@0.5", "policy-only")]
    assert (vs_twin["only_reference"], vs_twin["only_config"]) == (3, 1)  # p4-p6 lost, p2 gained
    assert vs_twin["p"] == pytest.approx(mcnemar_p(3, 1)) == pytest.approx(2 * 5 / 16)
    assert (pairs[("adaptive@0.5", "ar")]["only_reference"], pairs[("adaptive@0.5", "ar")]["only_config"]) == (3, 2)
    assert "## Paired accuracy" in markdown(data) and "| `adaptive@0.5` / `policy-only` | 10 | 3 | 1 | 0.625 |" in markdown(data)


def test_mcnemar_is_exact_and_symmetric():
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(5, 5) == 1.0
    assert mcnemar_p(0, 6) == pytest.approx(2 / 64) == pytest.approx(mcnemar_p(6, 0))
    assert mcnemar_p(17, 6) == pytest.approx(0.0347, abs=1e-4)  # the weak-drafter math split (session 8 NOTE)
