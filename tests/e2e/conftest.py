"""Server-level fixtures: tiny checkpoints, and OpenAI-compatible servers started the way the images
start them (deploy/entrypoint.sh), on 127.0.0.1 only."""

from __future__ import annotations

import os
import time

import pytest

from vllm_adaptivespec.bench.server import Server, ServerFailed

STARTUP_TIMEOUT_S = float(os.environ.get("ADAPTIVESPEC_E2E_STARTUP_S", 420))
# Small and single-engine-process: the point is the HTTP surface, not speed.
TINY_SERVER_ARGS = ("--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4",
                    "--distributed-executor-backend", "uni", "--seed", "0")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from vllm_adaptivespec.models.tiny import write_tiny_models

    return write_tiny_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="module")
def start_servers(tmp_path_factory):
    """Start several servers at once (their start-ups overlap), wait until all answer /health."""
    started: list[Server] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def start(args: tuple[str, ...] = TINY_SERVER_ARGS, **servers: dict[str, str]) -> dict[str, Server]:
        new = {name: Server(name, env, log_dir, args) for name, env in servers.items()}
        started.extend(new.values())
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            for server in new.values():
                server.wait_healthy(deadline)
        except ServerFailed as err:
            pytest.fail(str(err))
        return new

    yield start
    for server in started:
        server.stop()
