"""A tiny, explicit patch registry: every vLLM attribute we replace goes through `replace()`.

Modelled on Arctic Inference's patching module: one place that records what was replaced (for
`patches/` and its contract test), refuses to patch the same attribute twice, and logs each patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vllm.logger import init_logger

logger = init_logger("vllm.adaptivespec")


@dataclass(frozen=True)
class AppliedPatch:
    owner: str
    name: str
    why: str


_APPLIED: dict[tuple[int, str], AppliedPatch] = {}
_ORIGINALS: dict[tuple[int, str], Any] = {}


def replace(owner: Any, name: str, new: Any, why: str) -> Any:
    """Set `owner.name = new` once per process and return the original attribute."""
    key = (id(owner), name)
    if key in _APPLIED:
        raise RuntimeError(f"{_qualname(owner)}.{name} is already patched by AdaptiveSpec")
    original = getattr(owner, name)
    setattr(owner, name, new)
    _APPLIED[key] = AppliedPatch(_qualname(owner), name, why)
    _ORIGINALS[key] = original
    logger.debug("AdaptiveSpec patched %s.%s: %s", _qualname(owner), name, why)
    return original


def wrap(owner: Any, name: str, why: str) -> Callable[[Callable], Callable]:
    """Decorator form: the decorated function receives the original as its first argument."""

    def decorate(fn: Callable) -> Callable:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            return fn(original, *args, **kwargs)

        wrapper.__name__ = getattr(original, "__name__", name)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        replace(owner, name, wrapper, why)
        return wrapper

    return decorate


def register_attention_backend(backend: Any, class_path: str, why: str) -> None:
    """Point one of vLLM's attention backends at our subclass (vLLM's registry override), recorded
    like any other patch; refuses a second override of the same backend."""
    from vllm.v1.attention.backends.registry import register_backend

    key = (id(type(backend)), backend.name)
    if key in _APPLIED:
        raise RuntimeError(f"attention backend {backend.name} is already overridden by AdaptiveSpec")
    _ORIGINALS[key] = backend.get_path()
    register_backend(backend, class_path)
    _APPLIED[key] = AppliedPatch("AttentionBackendEnum", backend.name, why)
    logger.debug("AdaptiveSpec overrode attention backend %s with %s: %s", backend.name, class_path, why)


def original(owner: Any, name: str) -> Any:
    """What vLLM had at `owner.name` before we patched it (the attribute itself if unpatched)."""
    return _ORIGINALS.get((id(owner), name), getattr(owner, name))


def applied_patches() -> list[AppliedPatch]:
    return list(_APPLIED.values())


def _qualname(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
