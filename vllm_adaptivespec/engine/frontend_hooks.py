"""Hooks in the process that builds the engine config and admits requests (`LLM`, `vllm serve`).

Bad AdaptiveSpec settings fail here, at startup, with the field named, instead of deep inside the
engine core; a bad per-request value becomes a 400 for that request alone.
"""

from __future__ import annotations

import os

from vllm.engine.arg_utils import EngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger
from vllm.v1.engine.input_processor import InputProcessor

from vllm_adaptivespec import __version__
from vllm_adaptivespec.engine.compat import require_supported_vllm
from vllm_adaptivespec.engine.patching import wrap
from vllm_adaptivespec.engine.request_params import request_tau
from vllm_adaptivespec.engine.settings import raw_settings, resolve, settings_for

logger = init_logger("vllm.adaptivespec")


def install() -> None:
    @wrap(EngineArgs, "create_engine_config", "validate AdaptiveSpec settings at startup")
    def create_engine_config(original, self, *args, **kwargs):
        raw = raw_settings(self.additional_config)
        if raw is None:
            return original(self, *args, **kwargs)
        require_supported_vllm()
        # Our hooks live in the V1 model runner and need synchronous scheduling (draft lengths
        # differ per request); CUDA defaults to Model Runner V2 and async scheduling.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        if self.async_scheduling:
            logger.warning("AdaptiveSpec: async scheduling is turned off (per-request draft lengths)")
        self.async_scheduling = False
        vllm_config = original(self, *args, **kwargs)
        config = resolve(raw, vllm_config.speculative_config)
        logger.info("AdaptiveSpec %s active: %s", __version__, config.model_dump_json())
        return vllm_config

    @wrap(InputProcessor, "_validate_params", "reject bad per-request AdaptiveSpec values with 400")
    def _validate_params(original, self, params, *args, **kwargs):
        result = original(self, params, *args, **kwargs)
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
