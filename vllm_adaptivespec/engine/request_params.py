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
KNOWN_KEYS = (TAU_KEY, LOSSLESS_KEY)


class RequestParamError(ValueError):
    """A bad per-request value; `key` is the `vllm_xargs` key at fault."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def request_tau(extra_args: Mapping[str, Any] | None, config: AdaptiveSpecConfig) -> float:
    """The tau this request verifies with; raises RequestParamError (a ValueError) naming the key when invalid.

    ``adaptivespec_lossless``: true/false (or 1/0); ``adaptivespec_tau``: a number (not a string, not a
    boolean, not NaN) in [min_request_tau, 1]. Any other key that starts with "adaptivespec" is a
    misspelling and refused, so a client never believes a margin is set when none is."""
    args = extra_args or {}
    unknown = [key for key in args if str(key).lower().startswith("adaptivespec") and key not in KNOWN_KEYS]
    if unknown:
        raise RequestParamError(
            unknown[0], f"unknown AdaptiveSpec request key {unknown[0]!r}; known: {', '.join(KNOWN_KEYS)}"
        )
    lossless = args.get(LOSSLESS_KEY, False)
    if lossless not in (True, False) or isinstance(lossless, float):  # bools and the ints 1 / 0
        raise RequestParamError(LOSSLESS_KEY, f"{LOSSLESS_KEY} must be true/false or 1/0 (got {lossless!r})")
    if lossless:
        return 1.0
    if TAU_KEY not in args:
        return config.tau
    value = args[TAU_KEY]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestParamError(
            TAU_KEY, f"{TAU_KEY} must be a number in [{config.min_request_tau}, 1] (got {value!r})"
        )
    tau = float(value)
    if not config.min_request_tau <= tau <= 1.0:  # NaN fails this too
        raise RequestParamError(
            TAU_KEY,
            f"{TAU_KEY} must be in [{config.min_request_tau}, 1]: 1 is lossless, and this server "
            f"allows no looser margin than adaptivespec.min_request_tau={config.min_request_tau} "
            f"(got {tau})"
        )
    return tau
