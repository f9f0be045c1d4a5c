"""Per-request AdaptiveSpec control through vLLM's `SamplingParams.extra_args`.

OpenAI clients set them with `extra_body={"vllm_xargs": {"adaptivespec_tau": 0.7}}` or
`{"adaptivespec_lossless": 1}`. The front end validates them at admission (a bad value is a 400 for
that request only); the worker reads them when it verifies that request's drafts.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm_adaptivespec.config import AdaptiveSpecConfig

TAU_KEY = "adaptivespec_tau"
LOSSLESS_KEY = "adaptivespec_lossless"
_TRUE = {True, 1, "1", "true", "True", "yes"}
_FALSE = {False, 0, "0", "false", "False", "no"}


def request_tau(extra_args: Mapping[str, Any] | None, config: AdaptiveSpecConfig) -> float:
    """The tau this request verifies with; raises ValueError with the key named when invalid."""
    args = extra_args or {}
    lossless = args.get(LOSSLESS_KEY, False)
    if lossless not in _TRUE | _FALSE:
        raise ValueError(f"{LOSSLESS_KEY} must be true/false or 1/0 (got {lossless!r})")
    if lossless in _TRUE:
        return 1.0
    if TAU_KEY not in args:
        return config.tau
    value = args[TAU_KEY]
    try:
        tau = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{TAU_KEY} must be a number in [{config.min_request_tau}, 1] (got {value!r})")
    if not config.min_request_tau <= tau <= 1.0:
        raise ValueError(
            f"{TAU_KEY} must be in [{config.min_request_tau}, 1]: 1 is lossless, and this server "
            f"allows no looser margin than adaptivespec.min_request_tau={config.min_request_tau} "
            f"(got {tau})"
        )
    return tau
