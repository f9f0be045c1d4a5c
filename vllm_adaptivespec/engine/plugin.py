"""vLLM general-plugin entry point (`vllm.general_plugins = adaptivespec`).

vLLM calls `register()` in every process it starts (front end, engine core, workers). We install our
hooks there; each hook stays inert unless the engine's config carries `adaptivespec` settings, so
installing the package never changes stock vLLM behaviour.
"""

from __future__ import annotations

import os

from vllm.logger import init_logger

from vllm_adaptivespec import __version__

logger = init_logger("vllm.adaptivespec")
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from vllm_adaptivespec.engine.compat import SUPPORTED_VLLM, installed_vllm_version, vllm_version_supported

    if not vllm_version_supported():
        # Stay out of the way of stock vLLM; a request for AdaptiveSpec is refused at config time.
        _install_refusal()
        logger.warning(
            "vllm-adaptivespec %s supports vLLM %s only (found %s): plugin inactive",
            __version__, SUPPORTED_VLLM, installed_vllm_version(),
        )  # fmt: skip
        return
    from vllm_adaptivespec.engine import core_hooks, cpu_fixes, frontend_hooks, metrics, worker_hooks

    metrics.extend_spec_decoding_stats()
    metrics.install_frontend_metrics()
    frontend_hooks.install()
    core_hooks.install()
    worker_hooks.install()
    cpu_fixes.install()
    logger.info("vllm-adaptivespec %s plugin loaded (pid %d)", __version__, os.getpid())


def _install_refusal() -> None:
    """On an unsupported vLLM, asking for AdaptiveSpec fails at startup with a clear message."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_adaptivespec.engine.compat import require_supported_vllm
    from vllm_adaptivespec.engine.patching import wrap
    from vllm_adaptivespec.engine.settings import raw_settings

    @wrap(EngineArgs, "create_engine_config", "refuse AdaptiveSpec on an unsupported vLLM")
    def create_engine_config(original, self, *args, **kwargs):
        if raw_settings(self.additional_config) is not None:
            require_supported_vllm()
        return original(self, *args, **kwargs)
