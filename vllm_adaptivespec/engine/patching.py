"""A tiny, explicit patch registry: every change AdaptiveSpec makes to vLLM goes through it.

Modelled on Arctic Inference's patching module: one place that records what was changed (for
`patches/contract.json` and its test), refuses to change the same thing twice, and logs each change.
The kinds of change, each recorded when the plugin installs it:

* `replace` / `wrap`: an attribute replaced for the life of the process;
* `register_attention_backend`: one of vLLM's attention backends pointed at our subclass;
* `ScopedSwap`: a module attribute swapped only inside a ``with`` block (the proposer classes while an
  AdaptiveSpec runner builds its drafter);
* `add_dataclass_fields`: extra fields on one of vLLM's dataclasses (so they travel with it);
* `EnvSwitch`: an environment variable vLLM reads, set when AdaptiveSpec is requested.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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


def _record(key: tuple, owner: str, name: str, why: str, what: str) -> None:
    if key in _APPLIED:
        raise RuntimeError(f"{owner}.{name} is already changed by AdaptiveSpec")
    _APPLIED[key] = AppliedPatch(owner, name, why)
    logger.debug("AdaptiveSpec %s %s.%s: %s", what, owner, name, why)


class ScopedSwap:
    """``owner.name`` replaced by ``new`` only inside ``with swap.applied():`` (recorded once, at creation)."""

    def __init__(self, owner: Any, name: str, new: Any, why: str):
        _record((id(owner), name), _qualname(owner), name, why, "swaps (scoped)")
        self.owner, self.name, self.new = owner, name, new

    @contextmanager
    def applied(self) -> Iterator[None]:
        saved = getattr(self.owner, self.name)
        setattr(self.owner, self.name, self.new)
        try:
            yield
        finally:
            setattr(self.owner, self.name, saved)


def add_dataclass_fields(cls: type, fields: dict[str, tuple[type, Any]], why: str) -> None:
    """Give dataclass ``cls`` the fields ``{name: (type, default)}`` (msgspec then encodes them too)."""
    for name, (typ, default) in fields.items():
        _record((id(cls), name), _qualname(cls), name, why, "adds dataclass field")
        field = dataclasses.field(default=default)
        field.name, field.type, field._field_type = name, typ, dataclasses._FIELD  # type: ignore[attr-defined]
        cls.__dataclass_fields__[name] = field
        cls.__annotations__[name] = typ
        setattr(cls, name, default)


class EnvSwitch:
    """An environment variable vLLM reads, set to ``value`` by ``apply()`` (declared once, at creation)."""

    def __init__(self, name: str, value: str, why: str):
        _record(("env", name), "env", name, why, "sets")
        self.name, self.value = name, value

    def apply(self) -> None:
        os.environ[self.name] = self.value


def original(owner: Any, name: str) -> Any:
    """What vLLM had at `owner.name` before we patched it (the attribute itself if unpatched)."""
    return _ORIGINALS.get((id(owner), name), getattr(owner, name))


def applied_patches() -> list[AppliedPatch]:
    return list(_APPLIED.values())


def _qualname(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
