"""Ray Serve application: each replica runs vLLM's own engine and OpenAI-compatible FastAPI app.

Why not `ray.serve.llm`: `ray[llm]` pins an older vLLM (and CUDA-only nixl), so it cannot be installed
beside the vLLM this plugin is pinned to. This app needs only `ray[serve]`: the replica builds the
engine exactly like `vllm serve` does (vLLM's argument parser, `AsyncLLM`, `build_app`,
`init_app_state`), so every `vllm serve` flag works, the AdaptiveSpec plugin loads through its entry
point, and the routes are vLLM's own: /v1/completions, /v1/chat/completions, /v1/models, /health,
/metrics (the metrics of the replica that answers).

Run:  serve run deploy/serve_config.yaml      (from the repository root; see docs/deploy.md)
"""

from __future__ import annotations

import json
import os
import types
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application

DEPLOYMENT_NAME = "AdaptiveSpecVLLM"


def vllm_cli_args(settings: dict[str, Any]) -> list[str]:
    """`vllm serve` flags from a mapping, by the rules of `vllm serve --config file.yaml`:
    `key: value` -> `--key value`, dicts as JSON, lists as several values, booleans as `--key`/`--no-key`."""
    argv: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def parse_vllm_args(settings: dict[str, Any]):
    """The argparse namespace `vllm serve` would build from these settings (validated the same way)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message):  # argparse would print and exit the replica; say what was wrong instead
            raise ValueError(f"vllm_args: {message}")

    if "model" not in settings:
        raise ValueError("vllm_args.model is required (a model path or hub id)")
    args = make_arg_parser(Parser(prog="ray_serve_app")).parse_args(vllm_cli_args(settings))
    validate_parsed_serve_args(args)
    return args


@serve.deployment(
    name=DEPLOYMENT_NAME,
    # One engine per replica; scale on queued + running requests per replica.
    autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 16},
    max_ongoing_requests=64,
    health_check_period_s=10,
    health_check_timeout_s=30,
)
@serve.ingress()
class AdaptiveSpecVLLM:
    """One vLLM engine (AdaptiveSpec active when `additional_config.adaptivespec` is set)."""

    async def __init__(self, vllm_args: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client_from_engine_args

        # AdaptiveSpec hooks vLLM's V1 model runner (the plugin sets this too when it is active).
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        self._args = parse_vllm_args(vllm_args)
        self._engine_context = build_async_engine_client_from_engine_args(AsyncEngineArgs.from_cli_args(self._args))
        self._engine = await self._engine_context.__aenter__()

    async def __serve_build_asgi_app__(self):
        """vLLM's app, with its state initialised as `vllm serve` does before it starts uvicorn."""
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.app import build_app

        tasks = await self._engine.get_supported_tasks()
        app = build_app(self._args, tasks, self._engine.model_config)
        await init_app_state(self._engine, app.state, self._args, tasks)
        # vLLM's engine-error handler flips `state.server.should_exit` (uvicorn's); Serve has no
        # uvicorn server here and restarts the replica through check_health instead.
        app.state.server = types.SimpleNamespace()
        return app

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def __del__(self):
        if getattr(self, "_engine_context", None) is not None:
            await self._engine_context.__aexit__(None, None, None)


class AppArgs(BaseModel):
    """The `args:` of the application in serve_config.yaml (replicas, CPUs, GPUs: its `deployments:`)."""

    model_config = ConfigDict(extra="forbid")

    vllm_args: dict[str, Any] = Field(description="`vllm serve` flags as key: value")
    model_pair: str | None = Field(
        None,
        description="a pair built by `adaptivespec models prepare`: fills in `model` and the drafter "
        "(`speculative_config.model`) where vllm_args leaves them out; a target filled in is served "
        "under the pair's name (and its path), unless vllm_args sets `served_model_name`",
    )

    def resolved_vllm_args(self) -> dict[str, Any]:
        settings = dict(self.vllm_args)
        if self.model_pair is not None:
            from vllm_adaptivespec.models import model_path

            if "model" not in settings:
                settings["model"] = str(model_path(self.model_pair, "target"))
                # Clients ask for the pair by name, as with scripts/serve.sh; the cache path, the
                # only name before, keeps working as a second one.
                settings.setdefault("served_model_name", [self.model_pair, settings["model"]])
            speculative = dict(settings.get("speculative_config") or {"method": "draft_model"})
            speculative.setdefault("model", str(model_path(self.model_pair, "drafter")))
            settings["speculative_config"] = speculative
        return settings


def build_app(args: dict[str, Any]) -> Application:
    """Application builder for `serve run` (import path `ray_serve_app:build_app`).

    The vLLM arguments are parsed here too, so a bad flag fails the deployment at once instead of
    in every replica. Model paths are resolved here, once: every node must see them at the same path."""
    vllm_args = AppArgs.model_validate(args).resolved_vllm_args()
    parse_vllm_args(vllm_args)
    return AdaptiveSpecVLLM.bind(vllm_args)
