"""Server-level fixtures: tiny checkpoints, and OpenAI-compatible servers started the way the images
start them (deploy/entrypoint.sh), on 127.0.0.1 only."""

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

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
STARTUP_TIMEOUT_S = float(os.environ.get("ADAPTIVESPEC_E2E_STARTUP_S", 420))
# Small and single-engine-process: the point is the HTTP surface, not speed.
TINY_SERVER_ARGS = ("--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4",
                    "--distributed-executor-backend", "uni", "--seed", "0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with _no_proxy.open(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class Server:
    """`deploy/entrypoint.sh` with some environment, in its own process group; logs to a file."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path):
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        full_env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHON": sys.executable,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            **env,
        }
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [str(ENTRYPOINT), *TINY_SERVER_ARGS], env=full_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if http_get(self.base_url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1)
        pytest.fail(f"{self.name} server not healthy after {STARTUP_TIMEOUT_S:.0f} s:\n{self.tail()}")

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.base_url + path)

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


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from vllm_adaptivespec.models.tiny import write_tiny_models

    return write_tiny_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="module")
def start_servers(tmp_path_factory):
    """Start several servers at once (their start-ups overlap), wait until all answer /health."""
    started: list[Server] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def start(**servers: dict[str, str]) -> dict[str, Server]:
        new = {name: Server(name, env, log_dir) for name, env in servers.items()}
        started.extend(new.values())
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for server in new.values():
            server.wait_healthy(deadline)
        return new

    yield start
    for server in started:
        server.stop()
