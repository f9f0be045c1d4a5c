"""The run loop without vLLM (a scripted stand-in worker): partial results, failures, resume, budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_adaptivespec.bench.results import ResumeError
from vllm_adaptivespec.bench.runner import Run
from vllm_adaptivespec.bench.settings import BenchSettings

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
