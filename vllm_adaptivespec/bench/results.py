"""The run's result directory, rewritten after every cell so an interrupted run keeps what it measured.

Layout::

    results.json                 settings, environment, models, configurations, every cell (+ derived ratios)
    results.md                   the Markdown table (see `report`)
    plots/*.png                  see `plots`
    outputs/<config>/<cell>.json the generated texts and token ids of one cell
    logs/<config>.log            vLLM's log of that configuration's process

A cell is one (configuration, workload, batch, temperature). Re-running into the same directory
skips cells already measured, as long as the settings that make cells comparable are unchanged.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

SCHEMA = 1
CELL_KEY = ("config", "workload", "batch", "temperature")


class ResumeError(RuntimeError):
    """The directory holds a run whose cells are not comparable with the requested one."""


def cell_key(cell: dict) -> tuple:
    return tuple(cell[k] for k in CELL_KEY)


def cell_slug(workload: str, batch: int, temperature: float) -> str:
    return f"{workload}-b{batch}-t{temperature:g}"


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

    def done(self, config: str, workload: str, batch: int, temperature: float) -> bool:
        cell = self.cell(config, workload, batch, temperature)
        return cell is not None and cell.get("status") == "ok"

    def put_cell(self, cell: dict, outputs: list[dict] | None = None) -> None:
        """Insert or replace a cell; its outputs go to their own file."""
        if outputs is not None:
            path = self.outputs_path(cell)
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path, json.dumps(outputs))
            cell["outputs_file"] = str(path.relative_to(self.directory))
        cells = self.data["cells"]
        for i, existing in enumerate(cells):
            if cell_key(existing) == cell_key(cell):
                cells[i] = cell
                return
        cells.append(cell)

    def outputs_path(self, cell: dict) -> Path:
        slug = cell_slug(cell["workload"], cell["batch"], cell["temperature"])
        return self.directory / "outputs" / cell["config"] / f"{slug}.json"

    def outputs(self, cell: dict) -> list[dict] | None:
        path = self.outputs_path(cell)
        return json.loads(path.read_text()) if path.exists() else None

    # ---- configurations
    def set_config(self, name: str, **info) -> None:
        self.data["configs"].setdefault(name, {}).update(info)

    def reject(self, name: str, reason: str) -> None:
        rejected = [r for r in self.data["rejected_configs"] if r["name"] != name]
        self.data["rejected_configs"] = rejected + [{"name": name, "reason": reason}]

    # ---- files
    def log_path(self, config: str) -> Path:
        path = self.directory / "logs" / f"{config}.log"
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
