"""Hooks in the process that builds the engine config and admits requests (`LLM`, `vllm serve`).

Bad AdaptiveSpec settings fail here, at startup, with the field named, instead of deep inside the
engine core; a bad per-request value becomes a 400 for that request alone. In the OpenAI server that 400
comes before a stream starts: the chat and completion handlers are wrapped when vLLM's API server
imports their modules (`_after_import`), so no other vLLM process pays for importing them.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable

from vllm.engine.arg_utils import EngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger
from vllm.v1.engine.input_processor import InputProcessor

from vllm_adaptivespec import __version__
from vllm_adaptivespec.config import AdaptiveSpecConfigError
from vllm_adaptivespec.engine.compat import require_supported_vllm
from vllm_adaptivespec.engine.patching import EnvSwitch, VllmPatch
from vllm_adaptivespec.engine.request_params import RequestParamError, request_tau
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
        _check_request_args(self, getattr(params, "extra_args", None))
        return result


# The OpenAI handlers that build a request's SamplingParams (and may answer with a stream).
OPENAI_HANDLERS = (
    ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "create_chat_completion"),
    ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion", "create_completion"),
)


class OpenAIAdmission:
    """API server only: each handler of ``OPENAI_HANDLERS`` checks a request's `vllm_xargs` before it
    runs, so a streamed request is answered 400 too (vLLM validates it only once the stream is first
    read, after a 200). Applied when vLLM imports the handler's module (``_after_import``): no other
    vLLM process pays for importing them."""

    def apply_patch(self) -> None:
        for module, cls, method in OPENAI_HANDLERS:
            _after_import(module, lambda loaded, cls=cls, method=method: _admit_before_streaming(loaded, cls, method))


OPENAI_ADMISSION = OpenAIAdmission()


def _admit_before_streaming(module: Any, cls_name: str, method: str) -> None:
    """Declare and apply the patch of one handler, ``module.cls_name.method``."""

    async def create(self, request, raw_request=None, *args, **kwargs):
        """reject bad per-request AdaptiveSpec values with 400 before a stream starts"""
        try:
            _check_request_args(self.input_processor, await _raw_xargs(request, raw_request))
        except VLLMValidationError as e:
            return self.create_error_response(e)
        return await getattr(patch.stock, method)(self, request, raw_request, *args, **kwargs)

    create.__name__ = method
    patch = type(f"{cls_name}Patch", (VllmPatch[getattr(module, cls_name)],), {method: create})
    patch.apply_patch()


def _check_request_args(input_processor: InputProcessor, extra_args: Any) -> None:
    """VLLMValidationError naming the key when a request's AdaptiveSpec values are bad."""
    if not hasattr(input_processor, "_adaptivespec_config"):
        input_processor._adaptivespec_config = settings_for(input_processor.vllm_config)
    config = input_processor._adaptivespec_config
    if config is not None and extra_args:
        try:
            request_tau(extra_args, config)
        except RequestParamError as e:
            raise VLLMValidationError(str(e), parameter=f"vllm_xargs.{e.key}") from e


async def _raw_xargs(request: Any, raw_request: Any) -> Any:
    """`vllm_xargs` as the client sent them: vLLM's request model turns JSON `true` into 1 (its values
    are str | int | float), which would make `"adaptivespec_tau": true` a valid lossless tau."""
    xargs = getattr(request, "vllm_xargs", None)
    if not xargs or raw_request is None:
        return xargs
    try:
        body = await raw_request.json()  # parsed once by FastAPI already; Starlette caches it
    except Exception:  # not JSON here (a test double, another ingress): the parsed values then
        return xargs
    raw = body.get("vllm_xargs") if isinstance(body, dict) else None
    if not isinstance(raw, dict):
        return xargs
    return {key: raw.get(key, value) for key, value in xargs.items()}


def _after_import(module_name: str, apply: Callable[[Any], None]) -> None:
    """`apply(module)` now if `module_name` is imported, else right after Python first runs it."""
    module = sys.modules.get(module_name)
    if module is not None:
        apply(module)
    else:
        sys.meta_path.insert(0, _AfterImport(module_name, apply))


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds one module with the other finders, and runs `apply` after its loader executed it."""

    def __init__(self, name: str, apply: Callable[[Any], None]):
        self.name, self.apply, self.loader = name, apply, None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.loader is not None:
            return None
        others = (finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec"))
        spec = next(filter(None, (finder.find_spec(fullname, path, target) for finder in others)), None)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        loader, self.loader = self.loader, None
        module.__loader__ = module.__spec__.loader = loader
        loader.exec_module(module)
        sys.meta_path.remove(self)
        self.apply(module)


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
