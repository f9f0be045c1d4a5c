"""An OpenAI-compatible server started the way the images start it (``deploy/entrypoint.sh`` -> vLLM's
server), on 127.0.0.1, in its own process group, logging to a file. Used by the server tests and the
load benchmark."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with _no_proxy.open(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class ServerFailed(RuntimeError):
    """The server exited or did not become healthy in time (the message ends with its log's tail)."""


class Server:
    """`deploy/entrypoint.sh` with ``env`` (the entrypoint's variables) and ``args`` (more `vllm serve`
    flags), listening on a free port of 127.0.0.1."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path, args: tuple[str, ...] = ()):
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log_dir) / f"{name}.log"
        full_env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHON": sys.executable,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            **env,
        }
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [str(ENTRYPOINT), *args], env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_healthy(self, deadline: float) -> None:
        """Until /health answers 200; raises `ServerFailed` if it exits first or ``deadline`` (monotonic) passes."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"{self.name} server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if http_get(self.base_url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1)
        raise ServerFailed(f"{self.name} server not healthy in time:\n{self.tail()}")

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.base_url + path)

    def metrics(self) -> dict[str, float]:
        """The server's /metrics, each sample summed over its labels (engines, models); a histogram's
        buckets apart, keyed ``name{le="x"}`` (so ``vllm:m_bucket{le="2.0"}`` counts observations <= 2)."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.get("/metrics")
        if status != 200:
            raise ServerFailed(f"{self.name} /metrics answered {status}:\n{text[:300]}")
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = sample.name + (f'{{le="{sample.labels["le"]}"}}' if "le" in sample.labels else "")
                totals[key] = totals.get(key, 0.0) + sample.value
        return totals

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGINT (vLLM's clean shutdown), then SIGKILL to the whole group if it lingers."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        try:  # engine processes left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
