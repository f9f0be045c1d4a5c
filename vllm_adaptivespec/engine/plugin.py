"""vLLM general-plugin entry point (`vllm.general_plugins = adaptivespec`).

vLLM calls `register()` in every process it starts (front end, engine core, workers). It applies every
patch AdaptiveSpec makes to vLLM (`engine/patching.py`), group by group; each stays inert unless the
engine's config carries `adaptivespec` settings, so installing the package never changes stock vLLM
behaviour. The one exception replaces a crash: on CPU, a seeded request whose prefill is chunked no
longer kills the engine core (`cpu_fixes.SeededDiscardPatch`, in every CPU runner).
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
    from vllm.platforms import current_platform

    from vllm_adaptivespec.engine import core_hooks, cpu_fixes, frontend_hooks, metrics, sampler, worker_hooks

    # Every change to vLLM, in the process it matters in (patches/contract.json lists each one).
    # All processes: our fields on SpecDecodingStats, before any msgpack decoder is built.
    metrics.STATS_FIELDS.apply_patch()
    # Front end: AdaptiveSpec counters on /metrics and figures on the spec-decode log line.
    metrics.SpecDecodingPromPatch.apply_patch()
    metrics.SpecDecodingLoggingPatch.apply_patch()
    # Front end: settings validated at startup (V1 runner, synchronous scheduling, tree attention
    # backend), per-request values at admission.
    frontend_hooks.V1_RUNNER.apply_patch()
    frontend_hooks.EngineArgsPatch.apply_patch()
    frontend_hooks.InputProcessorPatch.apply_patch()
    # API server only (when it imports the OpenAI handlers): the same check before a stream starts.
    frontend_hooks.OPENAI_ADMISSION.apply_patch()
    # Engine core: worker step stats into the step's SpecDecodingStats.
    core_hooks.SchedulerPatch.apply_patch()
    # Worker: our drafters and rejection sampler in an AdaptiveSpec runner, and the runner hooks.
    for swap in worker_hooks.RUNNER_CLASS_SWAPS:
        swap.apply_patch()
    worker_hooks.GPUModelRunnerPatch.apply_patch()
    sampler.REJECTION_SAMPLE.apply_patch()
    # Worker: tree attention backends (stock kernels for every row that is not a draft tree's).
    for backend in worker_hooks.TREE_ATTENTION_BACKENDS:
        backend.apply_patch()
    # Worker, CPU only: a vLLM-CPU bug on the speculative sampling path, and the crash of a seeded request
    # whose prefill is chunked (this one in every CPU runner: it replaces a crash, not a behaviour).
    if current_platform.is_cpu():
        cpu_fixes.EXPAND_BATCH_TO_TOKENS.apply_patch()
        cpu_fixes.SeededDiscardPatch.apply_patch()
    logger.info("vllm-adaptivespec %s plugin loaded (pid %d)", __version__, os.getpid())


def _install_refusal() -> None:
    """On an unsupported vLLM, asking for AdaptiveSpec fails at startup with a clear message."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_adaptivespec.engine.compat import require_supported_vllm
    from vllm_adaptivespec.engine.patching import VllmPatch
    from vllm_adaptivespec.engine.settings import raw_settings

    class EngineArgsRefusalPatch(VllmPatch[EngineArgs]):
        def create_engine_config(self, *args, **kwargs):
            """refuse AdaptiveSpec on an unsupported vLLM"""
            if raw_settings(self.additional_config) is not None:
                require_supported_vllm()
            return EngineArgsRefusalPatch.stock.create_engine_config(self, *args, **kwargs)

    EngineArgsRefusalPatch.apply_patch()
