"""Hooks in the process that builds the engine config and admits requests (`LLM`, `vllm serve`).

Bad AdaptiveSpec settings fail here, at startup, with the field named, instead of deep inside the
engine core; a bad per-request value becomes a 400 for that request alone.
"""

from __future__ import annotations

from vllm.engine.arg_utils import EngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger
from vllm.v1.engine.input_processor import InputProcessor

from vllm_adaptivespec import __version__
from vllm_adaptivespec.config import AdaptiveSpecConfigError
from vllm_adaptivespec.engine.compat import require_supported_vllm
from vllm_adaptivespec.engine.patching import EnvSwitch, VllmPatch
from vllm_adaptivespec.engine.request_params import request_tau
from vllm_adaptivespec.engine.settings import debug_settings, raw_settings, resolve, settings_for

logger = init_logger("vllm.adaptivespec")


# Our hooks live in the V1 model runner; CUDA defaults to Model Runner V2.
V1_RUNNER = EnvSwitch("VLLM_USE_V2_MODEL_RUNNER", "0", "AdaptiveSpec hooks vLLM's V1 model runner")


class EngineArgsPatch(VllmPatch[EngineArgs]):
    def create_engine_config(self, *args, **kwargs):
        """validate AdaptiveSpec settings at startup"""
        raw = raw_settings(self.additional_config)
        if raw is None:
            return EngineArgsPatch.stock.create_engine_config(self, *args, **kwargs)
        require_supported_vllm()
        # The V1 runner, and synchronous scheduling (draft lengths differ per request).
        V1_RUNNER.set()
        if self.async_scheduling:
            logger.warning("AdaptiveSpec: async scheduling is turned off (per-request draft lengths)")
        self.async_scheduling = False
        _use_tree_attention_backend(self)
        vllm_config = EngineArgsPatch.stock.create_engine_config(self, *args, **kwargs)
        config = resolve(raw, vllm_config.speculative_config)
        debug_settings(vllm_config)
        logger.info("AdaptiveSpec %s active: %s", __version__, config.model_dump_json())
        return vllm_config


class InputProcessorPatch(VllmPatch[InputProcessor]):
    def _validate_params(self, params, *args, **kwargs):
        """reject bad per-request AdaptiveSpec values with 400"""
        result = InputProcessorPatch.stock._validate_params(self, params, *args, **kwargs)
        if not hasattr(self, "_adaptivespec_config"):
            self._adaptivespec_config = settings_for(self.vllm_config)
        config = self._adaptivespec_config
        extra = getattr(params, "extra_args", None)
        if config is not None and extra:
            try:
                request_tau(extra, config)
            except ValueError as e:
                raise VLLMValidationError(str(e)) from e
        return result


def _use_tree_attention_backend(args: EngineArgs) -> None:
    """Draft trees need an attention backend with our ancestor-mask path: CPU always uses CPU_ATTN;
    on CUDA, target and drafter are pinned to FLASH_ATTN (another explicit choice is refused)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return
    chosen = args.attention_backend or getattr(args.attention_config, "backend", None)
    name = getattr(chosen, "name", chosen)
    if name not in (None, "FLASH_ATTN"):
        raise AdaptiveSpecConfigError(f"attention_backend: AdaptiveSpec needs FLASH_ATTN on CUDA (got {name})")
    if chosen is None:
        args.attention_backend = "FLASH_ATTN"
    if isinstance(args.speculative_config, dict):
        drafter = args.speculative_config.get("attention_backend")
        if getattr(drafter, "name", drafter) not in (None, "FLASH_ATTN"):
            raise AdaptiveSpecConfigError(
                f"speculative_config.attention_backend: AdaptiveSpec needs FLASH_ATTN on CUDA (got {drafter})"
            )
        args.speculative_config = {**args.speculative_config, "attention_backend": "FLASH_ATTN"}
