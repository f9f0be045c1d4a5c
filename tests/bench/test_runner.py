"""The run loop without vLLM (a scripted stand-in worker): partial results, failures, resume, budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_adaptivespec.bench.results import IDENTITY, ResultStore, ResumeError
from vllm_adaptivespec.bench.runner import Run
from vllm_adaptivespec.bench.settings import PRESETS, BenchSettings

FAKE = Path(__file__).with_name("fake_worker.py")


class FakeRun(Run):
    worker_command = (sys.executable, str(FAKE))


def _settings(output: Path, **overrides) -> BenchSettings:
    values = dict(
        target="/models/target", drafter="/models/drafter", configs=["ar", "static-k2"], taus=[0.5],
        workloads=["humaneval"], batches=[1, 2], temperatures=[0.0], humaneval_problems=[0, 2],
        general_limit=None, max_tokens={"humaneval": 16, "general": 16}, output=output,
    )
    values.update(overrides)
    return BenchSettings(**values)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_WORKER_CALLS", str(calls))

    def set_mode(mode: str):
        monkeypatch.setenv("FAKE_WORKER_MODE", mode)
        return lambda: [json.loads(line) for line in calls.read_text().splitlines()]

    return set_mode


def _results(directory: Path) -> dict:
    return json.loads((directory / "results.json").read_text())


def test_crash_keeps_finished_cells_and_resume_runs_only_the_rest(tmp_path, fake):
    out = tmp_path / "run"
    calls = fake("crash_after_1")
    code = FakeRun(_settings(out, configs=["ar", "static-k2", "bogus"]), "test", show_progress=False).execute()
    assert code == 1
    data = _results(out)
    assert data["rejected_configs"][0]["name"] == "bogus"
    by_status = {(c["config"], c["batch"]): c for c in data["cells"]}
    for config in ("ar", "static-k2"):
        ok, failed = by_status[(config, 1)], by_status[(config, 2)]
        assert ok["status"] == "ok" and ok["accuracy"]["value"] == 1.0  # canonical solutions, sandbox-run
        assert (out / ok["outputs_file"]).exists()
        assert failed["status"] == "failed" and "exited with status 3" in failed["error"]
        assert "simulated crash" in failed["error"] and f"logs/{config}.log" in failed["error"]
    assert by_status[("static-k2", 1)]["derived"]["speedup_vs_ar"] == pytest.approx(1.5)
    assert "| `static-k2` | 150.0 | 1.50x | 1.00x |" in (out / "results.md").read_text()

    calls = fake("ok")
    before = len(calls())
    code = FakeRun(_settings(out), "test again", show_progress=False).execute()
    assert code == 0
    resumed = calls()[before:]
    assert [c["cells"] for c in resumed] == [[["humaneval", 2, 0.0]]] * 2
    data = _results(out)
    assert all(c["status"] == "ok" for c in data["cells"]) and len(data["cells"]) == 4
    assert data["command"] == "test again" and data["resumed"]
    assert all(c["match_vs_ar"]["identical"] == 1.0 for c in data["cells"] if c["config"] != "ar")
    assert (out / "plots" / "speed_vs_tau.png").exists()


def test_math_is_scored_by_exact_match_and_general_is_not_scored(tmp_path, fake):
    out = tmp_path / "run"
    fake("ok")
    settings = _settings(out, configs=["ar", "static-k2"], workloads=["humaneval", "general", "math"], batches=[1],
                         general_limit=2, math_limit=6, max_tokens={"humaneval": 16, "general": 16, "math": 64})
    assert FakeRun(settings, "test", show_progress=False).execute() == 0
    data = _results(out)
    cells = {(c["config"], c["workload"]): c for c in data["cells"]}
    assert len(cells) == 6 and all(c["status"] == "ok" for c in cells.values())
    math = cells[("static-k2", "math")]
    assert math["n_requests"] == 6  # the first six generated problems
    accuracy = math["accuracy"]
    assert (accuracy["metric"], accuracy["correct"], accuracy["n"]) == ("exact_match", 4, 6)
    assert accuracy["value"] == pytest.approx(4 / 6)
    assert sorted(accuracy["failures"]) == ["math-002-sharing", "math-005-inventory"]
    assert all(f.startswith("expected ") for f in accuracy["failures"].values())
    assert math["derived"]["accuracy_recovery"] == pytest.approx(1.0)
    general = cells[("ar", "general")]
    assert general["accuracy"] is None and general["derived"]["accuracy_recovery"] is None
    assert cells[("ar", "humaneval")]["accuracy"]["value"] == 1.0
    text = (out / "results.md").read_text()
    assert _column(text, "math", "accuracy") == ["67% (4/6)"] * 2 and _column(text, "math", "recovery") == ["100%"] * 2
    assert _column(text, "general", "accuracy") == ["–"] * 2 and _column(text, "general", "recovery") == ["–"] * 2
    assert _column(text, "humaneval", "accuracy") == ["100% (2/2)"] * 2
    assert (out / "plots" / "math_accuracy_vs_tau.png").exists()


def _column(markdown: str, workload: str, name: str) -> list[str]:
    """One column of a workload's table in results.md."""
    lines = markdown.split(f"## {workload}, batch 1, temperature 0\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [[c.strip() for c in line.strip("|").split("|")][header.index(name)] for line in lines[2:]]


def test_settings_that_change_the_cells_refuse_to_resume(tmp_path, fake):
    out = tmp_path / "run"
    fake("ok")
    assert FakeRun(_settings(out, configs=["ar"]), "test", show_progress=False).execute() == 0
    with pytest.raises(ResumeError, match="--fresh"):
        FakeRun(_settings(out, max_tokens={"humaneval": 32, "general": 16}), "test", show_progress=False)
    fresh = FakeRun(_settings(out, max_tokens={"humaneval": 32, "general": 16}, configs=["ar"]), "test",
                    fresh=True, show_progress=False)
    assert fresh.store.data["cells"] == []


def test_engine_failure_and_missing_drafter_are_reported_per_cell(tmp_path, fake):
    out = tmp_path / "run"
    fake("engine_failed")
    settings = _settings(out, drafter=None, configs=["ar", "static-k2"])
    code = FakeRun(settings, "test", drafter_problem="run `adaptivespec models prepare --pair qwen-coder`",
                   show_progress=False).execute()
    assert code == 2
    cells = _results(out)["cells"]
    assert len(cells) == 4 and all(c["status"] == "failed" for c in cells)
    ar = [c for c in cells if c["config"] == "ar"]
    static = [c for c in cells if c["config"] == "static-k2"]
    assert all("engine failed: ValueError: this configuration is not supported" in c["error"] for c in ar)
    assert all("adaptivespec models prepare" in c["error"] for c in static)


def test_time_budget_skips_configurations_it_cannot_start(tmp_path, fake):
    out = tmp_path / "run"
    calls = fake("ok")
    code = FakeRun(_settings(out, budget_minutes=1e-6), "test", show_progress=False).execute()
    assert code == 2  # nothing measured
    assert not (tmp_path / "calls.jsonl").exists() or not calls()
    assert all(c["status"] == "skipped" and "time budget" in c["error"] for c in _results(out)["cells"])


def test_repeats_run_round_by_round_and_resume_skips_measured_repeats(tmp_path, fake, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("FAKE_WORKER_DRIFT", "0.1")  # each call 10% faster than the first: figures differ by round
    calls = fake("crash_after_1")
    settings = _settings(out, configs=["pinned-k2", "ar", "static-k2"], repeats=2)
    assert FakeRun(settings, "test", show_progress=False).execute() == 1
    order = ["ar", "static-k2", "pinned-k2"]  # references first, a pinned row right after its stock twin
    assert [c["config"] for c in calls()] == order * 2  # A B C A B C, a fresh worker each
    assert all(c["cells"] == [["humaneval", 1, 0.0], ["humaneval", 2, 0.0]] for c in calls())
    data = _results(out)
    cells = {(c["config"], c["batch"]): c for c in data["cells"]}
    ar = cells[("ar", 1)]
    assert [(r["repeat"], r["status"], r["tokens_per_s"]) for r in ar["repeats"]] == [(0, "ok", 100.0), (1, "ok", 130.0)]
    assert ar["tokens_per_s"] == pytest.approx(115.0) and ar["n_repeats"] == 2
    assert ar["spread"]["tokens_per_s"] == {"min": 100.0, "max": 130.0, "rel": pytest.approx(0.3)}
    assert [r["outputs_file"] for r in ar["repeats"]] == ["outputs/ar/humaneval-b1-t0.json",
                                                          "outputs/ar/humaneval-b1-t0.r1.json"]
    assert ar["outputs_file"] == ar["repeats"][0]["outputs_file"] and ar["accuracy"]["value"] == 1.0
    assert (out / "logs" / "ar.log").exists() and (out / "logs" / "ar.r1.log").exists()
    assert cells[("static-k2", 1)]["derived"]["speedup_vs_ar"] == pytest.approx(187.5 / 115)  # ratio of medians
    failed = cells[("ar", 2)]
    assert failed["status"] == "failed" and [r["status"] for r in failed["repeats"]] == ["failed", "failed"]
    assert "ar.r1.log" in failed["error"]  # the last round's
    pinned = cells[("pinned-k2", 1)]
    assert pinned["overhead_share"] == 0.02 and "overhead_share" not in cells[("static-k2", 1)]
    (pair,) = data["paired"]
    assert (pair["config"], pair["twin"], pair["batch"]) == ("pinned-k2", "static-k2", 1)
    assert [r["tokens_per_s_ratio"] for r in pair["rounds"]] == pytest.approx([180 / 165, 225 / 210])
    assert pair["tokens_per_s_ratio"] == pytest.approx(202.5 / 187.5) and pair["step_p50_ratio"] == 1.0

    calls = fake("ok")
    before = len(calls())
    assert FakeRun(settings, "test again", show_progress=False).execute() == 0
    resumed = calls()[before:]
    assert [c["config"] for c in resumed] == order * 2
    assert all(c["cells"] == [["humaneval", 2, 0.0]] for c in resumed)  # only the (cell, repeat)s not measured
    data = _results(out)
    assert len(data["cells"]) == 6 and all(c["status"] == "ok" and c["n_repeats"] == 2 for c in data["cells"])
    assert len(data["paired"]) == 2
    text = (out / "results.md").read_text()
    assert "| tok/s spread |" in text and "| p50 spread |" in text and "| overhead |" in text
    assert "## Pinned AdaptiveSpec vs stock speculation of the same shape" in text
    assert "## Repeats not measured" not in text

    before = len(calls())
    assert FakeRun(settings, "nothing left", show_progress=False).execute() == 0
    assert len(calls()) == before


def test_lean_preset_pairs_run_back_to_back_and_more_repeats_resume(tmp_path, fake):
    out = tmp_path / "run"
    calls = fake("ok")
    lean = PRESETS["lean"]
    settings = _settings(out, configs=lean["configs"], taus=lean["taus"], batches=[1], humaneval_problems=[2],
                         repeats=1)
    assert FakeRun(settings, "test", show_progress=False).execute() == 0
    order = ["static-k4", "pinned-k4", "static-k2", "pinned-k2", "static-tree"]
    assert [c["config"] for c in calls()] == order
    data = _results(out)
    assert all(c["n_repeats"] == 1 and c["spread"]["tokens_per_s"] is None for c in data["cells"])
    assert "| tok/s spread |" not in (out / "results.md").read_text()  # one round: no spread column
    assert FakeRun(settings.model_copy(update={"repeats": lean["repeats"]}), "test", show_progress=False).execute() == 0
    assert [c["config"] for c in calls()] == order * 2  # only the second round ran
    assert all(c["n_repeats"] == 2 for c in _results(out)["cells"])


def test_cells_written_before_repeats_count_as_the_first_repeat(tmp_path):
    legacy = {"config": "ar", "workload": "humaneval", "batch": 1, "temperature": 0.0, "row": "ar", "kind": "ar",
              "tau": None, "depth": None, "status": "ok", "n_requests": 2, "tokens_per_s": 100.0,
              "step_latency_ms": {"p50": 10.0}, "outputs_file": "outputs/ar/humaneval-b1-t0.json",
              "accuracy": {"value": 1.0}, "derived": {"speedup_vs_ar": 1.0}}
    store = ResultStore(tmp_path, {"cells": [legacy]})
    assert store.done("ar", "humaneval", 1, 0.0) and not store.done("ar", "humaneval", 1, 0.0, 1)
    second = {**{k: legacy[k] for k in IDENTITY}, "status": "ok", "n_requests": 2, "tokens_per_s": 120.0,
              "step_latency_ms": {"p50": 12.0}}
    store.put_cell(second, [{"id": "HumanEval/0", "text": "", "token_ids": []}], repeat=1)
    (cell,) = store.data["cells"]
    assert [(r["repeat"], r["tokens_per_s"]) for r in cell["repeats"]] == [(0, 100.0), (1, 120.0)]
    assert [r["outputs_file"] for r in cell["repeats"]] == ["outputs/ar/humaneval-b1-t0.json",
                                                            "outputs/ar/humaneval-b1-t0.r1.json"]
    assert "accuracy" not in cell["repeats"][0] and "derived" not in cell["repeats"][0]
    assert cell["tokens_per_s"] == 110.0 and cell["step_latency_ms"] == {"p50": 11.0}
    assert cell["accuracy"] == {"value": 1.0}  # still scored from the first repeat's outputs
    assert store.done("ar", "humaneval", 1, 0.0, 1)
