"""Run a vLLM engine spec in a fresh process (see engine_runner.py) and parse its JSON result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).with_name("engine_runner.py")


class EngineFailed(RuntimeError):
    def __init__(self, returncode: int, output: str):
        super().__init__(f"engine exited with {returncode}:\n{output[-6000:]}")
        self.output = output


def run_engine(spec: dict, timeout: float = 600, runner: Path = RUNNER) -> dict:
    """Build an engine from `spec` in a fresh process (``runner``: engine_runner.py, or another script
    that prints ``ENGINE_RESULT <json>``); return its outputs and metrics."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE_TEST", "1")}
    proc = subprocess.run(
        [sys.executable, str(runner), json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    for line in proc.stdout.splitlines():
        if line.startswith("ENGINE_RESULT "):
            return json.loads(line[len("ENGINE_RESULT ") :])
    raise EngineFailed(proc.returncode, output)
