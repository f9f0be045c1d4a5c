"""A tiny, explicit patch registry: every change AdaptiveSpec makes to vLLM is declared here.

Shaped like Arctic Inference's patching module: a patch is a named class, ``class XPatch(VllmPatch[X])``,
whose own attributes ``XPatch.apply_patch()`` copies onto ``X`` (a class or a module). The registry
records each change (for `patches/contract.json` and its test), refuses to change the same attribute
twice, and logs each change. Every kind of change has an ``apply_patch()``, which `engine/plugin.py`
``register()`` calls, group by group:

* `VllmPatch[Target]`: attributes of ``Target`` replaced for the life of the process; the replaced
  ones stay reachable as ``XPatch.stock.<name>`` (vLLM's own method, to call from ours);
* `BackendOverride`: one of vLLM's attention backends pointed at our subclass (vLLM's own registry);
* `ScopedSwap`: a module attribute swapped only inside ``with swap.applied():`` (the proposer and
  rejection-sampler classes while an AdaptiveSpec runner is built, vLLM's ``rejection_sample`` while
  our rejection sampler runs);
* `DataclassFields`: extra fields on one of vLLM's dataclasses (so they travel with it);
* `EnvSwitch`: an environment variable vLLM reads, set when AdaptiveSpec is requested.

A `ScopedSwap` or `EnvSwitch` refuses to act before it is applied, so none can change vLLM unlisted.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from types import FunctionType, SimpleNamespace
from typing import Any, Generic, Iterator, TypeVar

from vllm.logger import init_logger

logger = init_logger("vllm.adaptivespec")

Target = TypeVar("Target")


@dataclass(frozen=True)
class AppliedPatch:
    owner: str
    name: str
    why: str


_APPLIED: dict[tuple, AppliedPatch] = {}
_ORIGINALS: dict[tuple, Any] = {}


def _record(key: tuple, owner: str, name: str, why: str, what: str) -> None:
    if key in _APPLIED:
        raise RuntimeError(f"{owner}.{name} is already changed by AdaptiveSpec ({_APPLIED[key].why})")
    _APPLIED[key] = AppliedPatch(owner, name, why)
    logger.debug("AdaptiveSpec %s %s.%s: %s", what, owner, name, why)


class VllmPatch(Generic[Target]):
    """Base of a declared patch: ``class XPatch(VllmPatch[X])``; every attribute ``XPatch`` defines
    itself replaces (or adds) the attribute of that name on ``X`` when ``XPatch.apply_patch()`` runs.

    Each patched function's docstring says why (its first line is the registry's reason); the
    functions replaced are kept on ``XPatch.stock`` (``XPatch.stock.__init__(self, ...)``)."""

    _patch_target: Any
    stock: SimpleNamespace  # set by apply_patch: vLLM's attributes that this patch replaced

    def __class_getitem__(cls, target: Any) -> type:
        name = getattr(target, "__name__", repr(target))
        return type(f"{cls.__name__}[{name}]", (cls,), {"_patch_target": target})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "_patch_target"):
            raise TypeError(f"{cls.__name__}: declare a patch as `class XPatch(VllmPatch[Target])`")

    @classmethod
    def apply_patch(cls) -> None:
        target = cls._patch_target
        if "_patch_target" in vars(cls):
            raise TypeError("apply the named patch class, not VllmPatch[Target] itself")
        stock = {}
        for name, attr in list(vars(cls).items()):
            if name in _NOT_COPIED:
                continue
            why = _reason(cls, name, attr)
            _record((id(target), name), _qualname(target), name, why, f"patched ({cls.__name__})")
            if hasattr(target, name):
                stock[name] = _ORIGINALS[(id(target), name)] = getattr(target, name)
                if isinstance(attr, FunctionType) and callable(stock[name]):
                    attr.__wrapped__ = stock[name]  # inspect.signature still shows vLLM's signature
            setattr(target, name, attr)
        cls.stock = SimpleNamespace(**stock)


_NOT_COPIED = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__parameters__",
                         "__orig_bases__", "__annotations__", "__firstlineno__", "__static_attributes__"})  # fmt: skip


def _reason(cls: type, name: str, attr: Any) -> str:
    doc = inspect.getdoc(getattr(attr, "__func__", attr)) if callable(getattr(attr, "__func__", attr)) else None
    if not doc:  # data attributes have none: they are not patched this way
        raise TypeError(f"{cls.__name__}.{name}: a patched attribute needs a docstring saying why")
    return doc.splitlines()[0]


class BackendOverride:
    """One of vLLM's attention backends pointed at our subclass (vLLM's registry override)."""

    def __init__(self, backend: Any, class_path: str, why: str):
        self.backend, self.class_path, self.why = backend, class_path, why

    def apply_patch(self) -> None:
        from vllm.v1.attention.backends.registry import register_backend

        key = (id(type(self.backend)), self.backend.name)
        _record(key, "AttentionBackendEnum", self.backend.name, self.why, f"overrides ({self.class_path})")
        _ORIGINALS[key] = self.backend.get_path()
        register_backend(self.backend, self.class_path)


class _Declared:
    """A change that acts only after ``apply_patch()`` has recorded it."""

    _applied = False

    @property
    def is_applied(self) -> bool:
        return self._applied

    def _declare(self, key: tuple, owner: str, name: str, why: str, what: str) -> None:
        _record(key, owner, name, why, what)
        self._applied = True

    def _check_applied(self) -> None:
        if not self._applied:
            raise RuntimeError(f"{self!r} was never applied by the plugin (patches/contract.json lists it?)")


class ScopedSwap(_Declared):
    """``owner.name`` replaced by ``new`` only inside ``with swap.applied():``.

    ``applied(value)`` swaps in ``value`` instead (a bound method, say: the state it needs travels
    with it, not through a module global)."""

    def __init__(self, owner: Any, name: str, why: str, new: Any = None):
        self.owner, self.name, self.why, self.new = owner, name, why, new

    def apply_patch(self) -> None:
        self._declare((id(self.owner), self.name), _qualname(self.owner), self.name, self.why, "swaps (scoped)")

    @contextmanager
    def applied(self, value: Any = None) -> Iterator[None]:
        self._check_applied()
        saved = getattr(self.owner, self.name)
        setattr(self.owner, self.name, self.new if value is None else value)
        try:
            yield
        finally:
            setattr(self.owner, self.name, saved)

    def __repr__(self) -> str:
        return f"ScopedSwap({_qualname(self.owner)}.{self.name})"


class DataclassFields:
    """Extra fields ``{name: (type, default)}`` on vLLM's dataclass ``cls`` (msgspec then encodes them too)."""

    def __init__(self, cls: type, fields: dict[str, tuple[type, Any]], why: str):
        self.cls, self.fields, self.why = cls, fields, why

    def apply_patch(self) -> None:
        cls = self.cls
        for name, (typ, default) in self.fields.items():
            _record((id(cls), name), _qualname(cls), name, self.why, "adds dataclass field")
            field = dataclasses.field(default=default)
            field.name, field.type, field._field_type = name, typ, dataclasses._FIELD  # type: ignore[attr-defined]
            cls.__dataclass_fields__[name] = field
            cls.__annotations__[name] = typ
            setattr(cls, name, default)


class EnvSwitch(_Declared):
    """An environment variable vLLM reads, set to ``value`` by ``set()``."""

    def __init__(self, name: str, value: str, why: str):
        self.name, self.value, self.why = name, value, why

    def apply_patch(self) -> None:
        self._declare(("env", self.name), "env", self.name, self.why, "sets")

    def set(self) -> None:
        self._check_applied()
        os.environ[self.name] = self.value

    def __repr__(self) -> str:
        return f"EnvSwitch({self.name})"


def original(owner: Any, name: str) -> Any:
    """What vLLM had at `owner.name` before we patched it (the attribute itself if unpatched)."""
    return _ORIGINALS.get((id(owner), name), getattr(owner, name))


def applied_patches() -> list[AppliedPatch]:
    return list(_APPLIED.values())


def _qualname(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
