"""The run's result directory, rewritten after every cell so an interrupted run keeps what it measured.

Layout::

    results.json                 settings, environment, models, configurations, every cell (+ derived ratios)
    results.md                   the Markdown table (see `report`)
    plots/*.png                  see `plots`
    outputs/<config>/<cell>.json the generated texts and token ids of one cell (<cell>.r<n>.json: repeat n > 0)
    logs/<config>.log            vLLM's log of that configuration's process (<config>.r<n>.log: repeat n > 0)

A cell is one (configuration, workload, batch, temperature), measured once per repeat (round of the
run): ``repeats`` holds each repeat's figures, and the cell's own figures are their medians. Re-running
into the same directory skips the (cell, repeat)s already measured, as long as the settings that make
cells comparable are unchanged.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

SCHEMA = 1
CELL_KEY = ("config", "workload", "batch", "temperature")
IDENTITY = (*CELL_KEY, "row", "kind", "tau", "depth")  # what every repeat of a cell shares
SCORES = ("accuracy", "match_vs_ar")  # scored from the cell's outputs_file (its first measured repeat)
SUMMARY = ("derived", "spread", "n_repeats", "repeats", "outputs_file", *SCORES)  # not a repeat's own figures


class ResumeError(RuntimeError):
    """The directory holds a run whose cells are not comparable with the requested one."""


def cell_key(cell: dict) -> tuple:
    return tuple(cell[k] for k in CELL_KEY)


def cell_slug(workload: str, batch: int, temperature: float) -> str:
    return f"{workload}-b{batch}-t{temperature:g}"


def repeat_suffix(repeat: int) -> str:
    """File-name suffix of a repeat: none for the first, so a one-repeat run keeps the plain names."""
    return f".r{repeat}" if repeat else ""


def repeats_of(cell: dict) -> list[dict]:
    """The cell's per-repeat records; a cell written before repeats existed is its own repeat 0."""
    if "repeats" in cell:
        return cell["repeats"]
    return [{"repeat": 0, **_own_figures(cell), "outputs_file": cell.get("outputs_file")}]


def _own_figures(cell: dict) -> dict:
    return {k: v for k, v in cell.items() if k not in IDENTITY and k not in SUMMARY}


def median(values: list) -> float | None:
    """Median of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def median_of(records: list[dict]) -> dict:
    """Figure by figure median of dicts of the same shape (nested dicts too: histogram buckets, latencies);
    what is not a number (lists, strings) is taken from the first record that has it."""
    out = {}
    for key in dict.fromkeys(k for r in records for k in r):
        values = [r[key] for r in records if r.get(key) is not None]
        if values and all(_is_number(v) for v in values):
            out[key] = median(values)
        elif values and all(isinstance(v, dict) for v in values):
            out[key] = median_of(values)
        else:
            out[key] = values[0] if values else None
    return out


def spread(values: list) -> dict | None:
    """min, max and max/min - 1 of the values that are not None; None for fewer than two."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    low, high = min(present), max(present)
    return {"min": low, "max": high, "rel": high / low - 1 if low > 0 else None}


def summarize(repeats: list[dict]) -> dict:
    """A cell's own figures from its repeats: medians over the measured ones, the spread of tok/s and step
    p50 and the first measured repeat's outputs; the last repeat's status and error when none was measured."""
    ok = [r for r in repeats if r.get("status") == "ok"]
    if not ok:
        return {"status": repeats[-1].get("status"), "error": repeats[-1].get("error")}
    figures = median_of([{k: v for k, v in r.items() if k not in ("repeat", "status", "error", "outputs_file")}
                         for r in ok])
    return {"status": "ok", **figures, "outputs_file": ok[0].get("outputs_file"), "n_repeats": len(ok),
            "spread": {"tokens_per_s": spread([r.get("tokens_per_s") for r in ok]),
                       "step_p50_ms": spread([(r.get("step_latency_ms") or {}).get("p50") for r in ok])}}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class ResultStore:
    def __init__(self, directory: Path, data: dict):
        self.directory = directory
        self.data = data

    @classmethod
    def open(cls, directory: Path, header: dict, fresh: bool = False) -> ResultStore:
        """Continue the run in ``directory`` or start one; ``header`` holds settings, fingerprint, etc."""
        path = directory / "results.json"
        if path.exists() and not fresh:
            data = json.loads(path.read_text())
            if data.get("fingerprint") != header["fingerprint"]:
                raise ResumeError(
                    f"{path} holds a run with different models/workloads/lengths "
                    f"(fingerprint {data.get('fingerprint')} != {header['fingerprint']}); "
                    "pass --fresh to overwrite it or choose another --output"
                )
            data.update({k: v for k, v in header.items() if k not in ("started",)})
            data.setdefault("resumed", []).append(_now())
        else:
            data = {"schema": SCHEMA, "started": _now(), **header, "configs": {}, "rejected_configs": [], "cells": []}
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory, data)

    # ---- cells
    def cell(self, config: str, workload: str, batch: int, temperature: float) -> dict | None:
        key = (config, workload, batch, temperature)
        return next((c for c in self.data["cells"] if cell_key(c) == key), None)

    def done(self, config: str, workload: str, batch: int, temperature: float, repeat: int = 0) -> bool:
        cell = self.cell(config, workload, batch, temperature)
        return cell is not None and any(r["repeat"] == repeat and r.get("status") == "ok" for r in repeats_of(cell))

    def put_cell(self, cell: dict, outputs: list[dict] | None = None, repeat: int = 0) -> None:
        """Insert or replace one repeat of a cell (its outputs go to their own file) and re-summarize the cell."""
        record = {"repeat": repeat, **_own_figures(cell)}
        if outputs is not None:
            path = self.outputs_path(cell, repeat)
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path, json.dumps(outputs))
            record["outputs_file"] = str(path.relative_to(self.directory))
        existing = self.cell(*cell_key(cell))
        others = [r for r in (repeats_of(existing) if existing else []) if r["repeat"] != repeat]
        repeats = sorted([*others, record], key=lambda r: r["repeat"])
        merged = {**{k: cell[k] for k in IDENTITY if k in cell}, **summarize(repeats)}
        if existing and existing.get("outputs_file") == merged.get("outputs_file"):
            merged.update({k: existing[k] for k in SCORES if k in existing})  # scored from the same outputs
        merged["repeats"] = repeats
        cells = self.data["cells"]
        for i, old in enumerate(cells):
            if cell_key(old) == cell_key(merged):
                cells[i] = merged
                return
        cells.append(merged)

    def outputs_path(self, cell: dict, repeat: int = 0) -> Path:
        slug = cell_slug(cell["workload"], cell["batch"], cell["temperature"])
        return self.directory / "outputs" / cell["config"] / f"{slug}{repeat_suffix(repeat)}.json"

    def outputs(self, cell: dict) -> list[dict] | None:
        """The outputs the cell is scored from (its first measured repeat's)."""
        name = cell.get("outputs_file")
        path = self.directory / name if name else self.outputs_path(cell)
        return json.loads(path.read_text()) if path.exists() else None

    # ---- configurations
    def set_config(self, name: str, **info) -> None:
        self.data["configs"].setdefault(name, {}).update(info)

    def reject(self, name: str, reason: str) -> None:
        rejected = [r for r in self.data["rejected_configs"] if r["name"] != name]
        self.data["rejected_configs"] = rejected + [{"name": name, "reason": reason}]

    # ---- files
    def log_path(self, config: str, repeat: int = 0) -> Path:
        path = self.directory / "logs" / f"{config}{repeat_suffix(repeat)}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def save(self) -> None:
        """Recompute the derived figures and rewrite results.json and results.md."""
        from .report import derive, markdown

        self.data["updated"] = _now()
        derive(self.data)
        _atomic_write(self.directory / "results.json", json.dumps(self.data, indent=1, sort_keys=False))
        _atomic_write(self.directory / "results.md", markdown(self.data))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
