"""Runs the benchmark: one worker process per configuration, results rewritten after every cell.

With ``repeats`` > 1 the whole configuration list runs that many rounds, interleaved (A B C A B C),
each configuration in a fresh worker process every round. A configuration that vLLM refuses, that
crashes, or that needs a missing model is recorded as failed (with the reason and its log) and the run
goes on with the next one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .configs import BenchConfig, select
from .environment import describe
from .results import ResultStore, cell_slug, repeats_of
from .sandbox import Limits
from .scoring import pass_share, score_edits, score_humaneval, score_math, score_mixed, score_quotes
from .settings import BenchSettings
from .workloads import Item, load

# Order configurations run in (by table row): the references first, then what is being measured,
# so a time budget cuts the least central ones. A pinned row runs right after its stock twin, so in
# every round the two are measured back to back.
RUN_ORDER = ("ar", "static-k4", "pinned-k4", "adaptive", "policy-only", "margin-k4", "static-k2", "pinned-k2",
             "static-k6", "static-k8", "dynamic", "ngram", "suffix", "suffix-k24")
POLL_S = 0.5


def _log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


class Run:
    # The process that measures one configuration (tests put a stand-in here).
    worker_command: tuple[str, ...] = (sys.executable, "-m", "vllm_adaptivespec.bench.worker")

    def __init__(self, settings: BenchSettings, command: str, fresh: bool = False,
                 drafter_problem: str | None = None, models: dict | None = None, show_progress: bool = True):
        self.settings = settings
        self.drafter_problem = drafter_problem
        self.show_progress = show_progress
        header = {
            "command": command,
            "fingerprint": settings.fingerprint(),
            "settings": settings.model_dump(mode="json"),
            "environment": describe(),
            "models": models or {"pair": None, "target": settings.target, "drafter": settings.drafter},
        }
        self.store = ResultStore.open(settings.output, header, fresh=fresh)
        self.items: dict[str, list[Item]] = {
            w: load(w, settings.humaneval_problems, settings.general_limit, settings.humaneval_format,
                    settings.math_limit, settings.math_seed, settings.edit_limit, settings.quote_limit,
                    settings.mixed_limit)
            for w in settings.workloads
        }
        self.cells = [(w, b, t) for w in settings.workloads for b in settings.batches for t in settings.temperatures]
        self.deadline = time.monotonic() + settings.budget_minutes * 60 if settings.budget_minutes else None
        self.config_seconds: list[float] = []

    # ---- helpers
    def _say(self, message: str) -> None:
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)

    def _base_cell(self, config: BenchConfig, workload: str, batch: int, temperature: float) -> dict:
        return {"config": config.name, "workload": workload, "batch": batch, "temperature": temperature,
                "row": config.row, "kind": config.kind, "tau": config.tau, "depth": config.depth}

    def _mark(self, config: BenchConfig, cells: list[tuple], repeat: int, status: str, error: str) -> None:
        for workload, batch, temperature in cells:
            if not self.store.done(config.name, workload, batch, temperature, repeat):
                self.store.put_cell({**self._base_cell(config, workload, batch, temperature),
                                     "status": status, "error": error}, repeat=repeat)
        self.store.save()

    # ---- the run
    def execute(self) -> int:
        configs, rejected = select(self.settings.configs, self.settings.taus, self.settings.drafter)
        for r in rejected:
            self.store.reject(r.name, r.reason)
            self._say(f"adaptivespec bench: skipping configuration {r.name!r}: {r.reason}")
        for config in configs:
            self.store.set_config(config.name, row=config.row, kind=config.kind, tau=config.tau,
                                  about=config.about, engine=config.engine_args())
        self.store.save()
        configs.sort(key=lambda c: RUN_ORDER.index(c.row) if c.row in RUN_ORDER else len(RUN_ORDER))
        # (repeat, configuration, its cells that repeat has not measured yet), in run order: round by round
        todo = [(r, c, [cell for cell in self.cells if not self.store.done(c.name, *cell, r)])
                for r in range(self.settings.repeats) for c in configs]
        total = sum(len(cells) for _, _, cells in todo)
        if not configs:
            self._say("adaptivespec bench: no configuration to run")
            return 2
        from tqdm import tqdm

        interrupted = False
        with tqdm(total=total, desc="cells", unit="cell", position=0, disable=not self.show_progress,
                  dynamic_ncols=True) as overall:
            try:
                for repeat, config, cells in todo:
                    if cells:
                        self._run_config(config, cells, overall, repeat)
            except KeyboardInterrupt:
                interrupted = True
                self._say("adaptivespec bench: interrupted; results measured so far are saved")
        self.finish()
        if interrupted:
            return 130
        records = [r for c in self.store.data["cells"] for r in repeats_of(c)]
        ok = any(r.get("status") == "ok" for r in records)
        failed = any(r.get("status") != "ok" for r in records) or rejected
        return 0 if ok and not failed else (1 if ok else 2)

    def finish(self) -> None:
        from .plots import draw_all

        self._score_pending()
        self.store.save()
        try:
            plots = draw_all(self.store.data, self.store.directory / "plots")
        except Exception as err:  # plots are a view of the saved results; never lose the run over them
            self._say(f"adaptivespec bench: plotting failed: {type(err).__name__}: {err}")
            plots = []
        self.store.data["plots"] = [str(p.relative_to(self.store.directory)) for p in plots]
        self.store.save()
        self._say(f"adaptivespec bench: results in {self.store.directory}/results.json, results.md"
                  + (f", {len(plots)} plots" if plots else ""))

    def _run_config(self, config: BenchConfig, cells: list[tuple], overall, repeat: int) -> None:
        self.store.set_config(config.name, error=None)
        if config.needs_drafter and not self.settings.drafter:
            reason = f"needs the drafter model: {self.drafter_problem or 'no drafter given (--drafter)'}"
            self._say(f"adaptivespec bench: {config.name}: {reason}")
            self._mark(config, cells, repeat, "failed", reason)
            overall.update(len(cells))
            return
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            typical = sum(self.config_seconds) / len(self.config_seconds) if self.config_seconds else 0.0
            if left <= 0 or left < 0.5 * typical:
                self._mark(config, cells, repeat, "skipped", "time budget of the run used up")
                overall.update(len(cells))
                return
        begin = time.monotonic()
        rounds = self.settings.repeats
        self._say(f"adaptivespec bench: {config.name}" + (f", round {repeat + 1}/{rounds}" if rounds > 1 else "")
                  + f" ({config.about})")
        with tempfile.TemporaryDirectory(prefix="adaptivespec-bench-") as tmp:
            job_path, events_path = Path(tmp) / "job.json", Path(tmp) / "events.jsonl"
            job = {
                "config": asdict(config),
                "target": self.settings.target,
                "engine": self.settings.engine_args(),
                "stall_timeout_s": self.settings.stall_timeout_s,
                "cells": [
                    {"workload": w, "batch": b, "temperature": t, "max_tokens": self.settings.max_tokens[w],
                     "items": [asdict(item) for item in self.items[w]]}
                    for w, b, t in cells
                ],
            }
            job_path.write_text(json.dumps(job))
            events_path.touch()
            log_path = self.store.log_path(config.name, repeat)
            finished = self._watch(config, cells, repeat, job_path, events_path, log_path, overall)
        self.config_seconds.append(time.monotonic() - begin)
        self._score_pending()
        self.store.save()
        if not finished:
            self._say(f"adaptivespec bench: {config.name}: not all cells completed; see {log_path}")

    def _watch(self, config, cells, repeat: int, job_path: Path, events_path: Path, log_path: Path, overall) -> bool:
        from tqdm import tqdm

        env = dict(os.environ)
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # With the engine in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1), vLLM's collective_rpc sends the
        # worker's callables (the step log, the suffix-cache reset) only through pickle, which it allows only
        # when told: the benchmark's own engines, on this machine, never a served one.
        env.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [*self.worker_command, str(job_path), str(events_path)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        reported: set[int] = set()
        offset = 0
        engine_error = None
        bar = tqdm(total=0, desc=f"  {config.name}: loading", unit="req", position=1, leave=False,
                   disable=not self.show_progress, dynamic_ncols=True)
        try:
            while True:
                exited = proc.poll() is not None
                with events_path.open() as f:
                    f.seek(offset)
                    chunk = f.read()
                # Only whole lines: the worker may be halfway through writing the last one.
                complete = chunk[: chunk.rfind("\n") + 1]
                offset += len(complete.encode())
                for line in complete.splitlines():
                    event = json.loads(line)
                    engine_error = self._on_event(config, cells, repeat, event, reported, bar, overall) or engine_error
                if exited:
                    break
                if self.deadline is not None and time.monotonic() > self.deadline:
                    self._stop(proc)
                    self._mark(config, [c for i, c in enumerate(cells) if i not in reported], repeat, "skipped",
                               "time budget of the run ran out while this configuration was running")
                    overall.update(len(cells) - len(reported))
                    return False
                time.sleep(POLL_S)
        except BaseException:
            self._stop(proc)
            raise
        finally:
            bar.close()
        missing = [c for i, c in enumerate(cells) if i not in reported]
        if missing:
            reason = engine_error or f"worker exited with status {proc.returncode}"
            self._mark(config, missing, repeat, "failed",
                       f"{reason} (log: {log_path}; last lines: {_log_tail(log_path, 3)})")
            overall.update(len(missing))
        return not missing

    def _on_event(self, config, cells, repeat: int, event: dict, reported: set[int], bar, overall) -> str | None:
        kind = event["event"]
        if kind == "loaded":
            self.store.set_config(config.name, engine_load_s=round(event["seconds"], 1),
                                  max_model_len=event.get("max_model_len"))
            bar.set_description(f"  {config.name}: engine up in {event['seconds']:.0f} s")
        elif kind == "progress":
            workload, batch, temperature = cells[event["index"]]
            bar.set_description(f"  {config.name} {cell_slug(workload, batch, temperature)}")
            bar.total = event["total"]
            bar.n = event["done"]
            bar.refresh()
        elif kind == "cell":
            workload, batch, temperature = cells[event["index"]]
            result = dict(event["result"])
            outputs = result.pop("outputs")
            self.store.put_cell({**self._base_cell(config, workload, batch, temperature), "status": "ok",
                                 "n_requests": len(outputs), **result}, outputs, repeat)
            self.store.save()
            reported.add(event["index"])
            overall.update(1)
        elif kind == "cell_failed":
            workload, batch, temperature = cells[event["index"]]
            self.store.put_cell({**self._base_cell(config, workload, batch, temperature), "status": "failed",
                                 "error": event["error"]}, repeat=repeat)
            self.store.save()
            reported.add(event["index"])
            overall.update(1)
            self._say(f"adaptivespec bench: {config.name} {cell_slug(workload, batch, temperature)} failed: "
                      f"{event['error']}")
        elif kind == "engine_failed":
            self.store.set_config(config.name, error=event["error"])
            self._say(f"adaptivespec bench: {config.name}: engine failed: {event['error']}")
            return f"engine failed: {event['error']}"
        return None

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    # ---- scoring (done between workers, never while one is timing)
    def _score_pending(self) -> None:
        limits = Limits(timeout_s=self.settings.sandbox_timeout_s)
        for cell in self.store.data["cells"]:
            if cell.get("status") != "ok":
                continue
            needs_accuracy = "accuracy" not in cell
            needs_match = cell["temperature"] == 0 and cell["config"] != "ar" and not cell.get("match_vs_ar")
            if not (needs_accuracy or needs_match):
                continue
            outputs = self.store.outputs(cell)
            if outputs is None:
                continue
            if needs_accuracy:
                cell["accuracy"] = self._accuracy(cell["workload"], outputs, limits)
            if needs_match:
                ar = self.store.cell("ar", cell["workload"], cell["batch"], cell["temperature"])
                ar_outputs = self.store.outputs(ar) if ar and ar.get("status") == "ok" else None
                if ar_outputs is not None:
                    cell["match_vs_ar"] = match_vs_reference(outputs, ar_outputs)

    def _accuracy(self, workload: str, outputs: list[dict], limits: Limits) -> dict | None:
        items = {item.id: item for item in self.items.get(workload, [])}
        if workload == "humaneval":
            problems = [items[o["id"]].reference for o in outputs]
            return pass_share("pass@1", outputs, score_humaneval(problems, [o["text"] for o in outputs], limits))
        if workload == "math":
            return score_math({o["id"]: items[o["id"]].reference["answer"] for o in outputs}, outputs)
        if workload == "edit":
            return score_edits({o["id"]: items[o["id"]].reference for o in outputs}, outputs, limits)
        if workload == "quote":
            return score_quotes({o["id"]: items[o["id"]].reference["sentence"] for o in outputs}, outputs)
        if workload == "mixed":
            return score_mixed({o["id"]: items[o["id"]].reference for o in outputs}, outputs, limits)
        return None  # general: free-form answers, speed only


def match_vs_reference(outputs: list[dict], reference: list[dict]) -> dict:
    """Share of answers token-identical to the reference's, and mean share of tokens before the first difference."""
    ref = {o["id"]: o["token_ids"] for o in reference}
    identical, prefix = 0, 0.0
    pairs = [(o["token_ids"], ref[o["id"]]) for o in outputs if o["id"] in ref]
    for ids, ref_ids in pairs:
        identical += ids == ref_ids
        common = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))
        prefix += common / max(len(ref_ids), 1)
    n = len(pairs)
    return {"identical": identical / n if n else None, "common_prefix": prefix / n if n else None, "n": n}
