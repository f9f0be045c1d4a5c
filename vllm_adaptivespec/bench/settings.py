"""What one benchmark run measures: the presets (quick, tree, lean, full) and the validated settings object."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .math_problems import DEFAULT_SEED
from .workloads import WORKLOADS

# What a mode runs unless --workloads says otherwise. Checked math (`math`) and the copying workloads (`edit`,
# `quote`, `mixed`) are in the full mode; the shorter modes keep the two workloads their timings were measured
# with and take the others on request (every mode has their sizes and max_tokens).
SPEED_WORKLOADS = ("humaneval", "general")

# Fixed HumanEval subset of the quick mode: problems whose answers are a few lines, so short
# generations still finish them and pass@1 means something.
QUICK_HUMANEVAL = [0, 13, 35, 55]
# Eight problems with 6-8 line answers (long enough that decoding, not prefill, dominates a cell),
# so batch 8 has eight requests in flight.
TREE_HUMANEVAL = [3, 8, 11, 12, 31, 55, 58, 150]
# The tree problems plus the 24 with the longest canonical solutions of at most 115 qwen-coder tokens
# (82-115, 2,341 in all). The tree eight took 312 tokens; qwen-coder's answers ran ~0.9x the canonical
# length there, so at a conservative 0.6x these 32 give 312 + 0.6 * 2341 ~ 1,700 output tokens per cell.
LEAN_HUMANEVAL = sorted(TREE_HUMANEVAL + [1, 6, 19, 20, 32, 39, 59, 75, 94, 99, 105, 106, 107, 108, 114, 118,
                                          119, 123, 127, 130, 143, 146, 147, 161])

# Cells of at least 1,500 output tokens, batch 1 and 8, greedy, two interleaved rounds: 32 problems
# (2,133 tokens a cell with qwen-coder; answers stop at the closing fence) and 16 general prompts
# (1,965 tokens), measured; 16 math problems when math is asked for (not measured yet).
LONG_CELLS = {
    "workloads": list(SPEED_WORKLOADS),
    "batches": [1, 8],
    "temperatures": [0.0],
    "humaneval_problems": LEAN_HUMANEVAL,
    "general_limit": 16,
    "math_limit": 16,
    **{"edit_limit": 16, "quote_limit": 16, "mixed_limit": 16},
    "max_tokens": {"humaneval": 160, "general": 128, "math": 192, "edit": 384, "quote": 64, "mixed": 384},
    "budget_minutes": None,
    "repeats": 2,
}

PRESETS: dict[str, dict] = {
    # AdaptiveSpec against its references at batch 1, greedy, one tau, short answers. Sized for the
    # qwen-coder pair on 2 CPU cores: 1.5-3.5 minutes per configuration measured on the shared, busy
    # dev machine (engine start ~35 s), about 14 minutes for these five; the budget stops starting
    # configurations after 14 minutes whatever the machine.
    "quick": {
        "configs": ["ar", "static-k4", "policy-only", "margin-k4", "adaptive"],
        "taus": [0.5],
        "workloads": list(SPEED_WORKLOADS),
        "batches": [1],
        "temperatures": [0.0],
        "humaneval_problems": QUICK_HUMANEVAL,
        "general_limit": 4,
        "math_limit": 4,
        **{"edit_limit": 4, "quote_limit": 4, "mixed_limit": 8},
        "max_tokens": {"humaneval": 64, "general": 40, "math": 128, "edit": 256, "quote": 48, "mixed": 256},
        "budget_minutes": 14.0,
    },
    # Trees against chains and stock vLLM speculation at batch 1 and 8, lossless and with the margin
    # rule. About 5-7 minutes per configuration on 2 idle CPU cores.
    "tree": {
        "configs": ["ar", "ngram", "static-k2", "static-k4", "policy-only", "adaptive", "static-tree",
                    "tree-policy-only", "adaptive-tree"],
        "taus": [0.5],
        "workloads": list(SPEED_WORKLOADS),
        "batches": [1, 8],
        "temperatures": [0.0],
        "humaneval_problems": TREE_HUMANEVAL,
        "general_limit": 8,
        "math_limit": 8,
        **{"edit_limit": 8, "quote_limit": 8, "mixed_limit": 8},
        "max_tokens": {"humaneval": 128, "general": 96, "math": 160, "edit": 384, "quote": 64, "mixed": 384},
        "budget_minutes": None,
    },
    # The plugin's own cost: AdaptiveSpec pinned to static-k2's and static-k4's shape, each run right after
    # its stock twin, plus the fixed tree; two interleaved rounds (A B C A B C) so each cell has a spread
    # and each pair a per-round ratio. At least 1,500 output tokens per cell (LONG_CELLS).
    "lean": {
        "configs": ["static-k2", "pinned-k2", "static-k4", "pinned-k4", "static-tree"],
        "taus": [],
        **LONG_CELLS,
    },
    # Never slower than the choice it replaces: AdaptiveSpec (step plan, lossless and tau 0.5) against the
    # target alone and every stock configuration that runs here (static k = 1..4, n-gram, suffix decoding at 8
    # and at vLLM's default 24 tokens a step where Arctic Inference is installed, else rejected with the reason,
    # vLLM's batch-size schedule), on
    # the same cells as "lean". About 5 minutes per configuration and round on 2 CPU cores (45-50 minutes a round).
    "stock": {
        "configs": ["ar", "static-k1", "static-k2", "static-k3", "static-k4", "ngram", "suffix", "suffix-k24",
                    "dynamic", "policy-only", "adaptive"],
        "taus": [0.5],
        **LONG_CELLS,
    },
    # The whole matrix of the issue: all 164 problems, all prompts, all 240 math problems, both batch sizes
    # and temperatures.
    "full": {
        "configs": ["all"],
        "taus": [0.9, 0.7, 0.5, 0.3, 0.1],
        "workloads": list(WORKLOADS),
        "batches": [1, 8],
        "temperatures": [0.0, 0.7],
        "humaneval_problems": None,
        "general_limit": None,
        "math_limit": None,
        **{"edit_limit": None, "quote_limit": None, "mixed_limit": 48},
        "max_tokens": {"humaneval": 384, "general": 256, "math": 320, "edit": 512, "quote": 96, "mixed": 512},
        "budget_minutes": None,
    },
}


class BenchSettings(BaseModel):
    """Validated settings; everything that changes what is measured is in the fingerprint."""

    model_config = ConfigDict(extra="forbid")

    mode: str = "quick"
    pair: str = "qwen-coder"
    target: str
    drafter: str | None = None
    configs: list[str]
    taus: list[float]
    workloads: list[str] = Field(default_factory=lambda: list(WORKLOADS))
    batches: list[int]
    temperatures: list[float]
    humaneval_problems: list[int] | None
    humaneval_format: Literal["continue", "restate"] = "continue"
    general_limit: int | None
    # Checked math: how many of the generated problems (the first N, kinds in turn; None = all 240) and their seed.
    math_limit: int | None = Field(None, ge=1)
    math_seed: int = DEFAULT_SEED
    # Copying workloads: how many edits (of 164, evenly spread), quotes (of 24) and mixed items (None = 16).
    edit_limit: int | None = Field(None, ge=1)
    quote_limit: int | None = Field(None, ge=1)
    mixed_limit: int | None = Field(None, ge=1)
    max_tokens: dict[str, int]
    max_model_len: int = 2048
    enforce_eager: bool = True
    dtype: str = "bfloat16"
    budget_minutes: float | None = None
    # Rounds of the whole configuration list (A B C A B C ...), each configuration in a fresh process.
    repeats: int = Field(1, ge=1)
    sandbox_timeout_s: float = 20.0
    # A cell whose requests get no token for this long is failed as stuck (slow steps are far shorter).
    stall_timeout_s: float = Field(300.0, gt=0)
    output: Path

    @field_validator("workloads")
    @classmethod
    def _known_workloads(cls, value: list[str]) -> list[str]:
        unknown = [w for w in value if w not in WORKLOADS]
        if unknown:
            raise ValueError(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
        return value

    @model_validator(mode="after")
    def _lengths_for_every_workload(self) -> "BenchSettings":
        missing = [w for w in self.workloads if w not in self.max_tokens]
        if missing:
            raise ValueError(f"no max_tokens for workloads {missing}")
        return self

    @field_validator("batches")
    @classmethod
    def _positive_batches(cls, value: list[int]) -> list[int]:
        if not value or any(b < 1 for b in value):
            raise ValueError("batch sizes must be >= 1")
        return sorted(set(value))

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, value: list[float]) -> list[float]:
        if not value or any(t < 0 for t in value):
            raise ValueError("temperatures must be >= 0")
        return sorted(set(value))

    @field_validator("taus")
    @classmethod
    def _taus(cls, value: list[float]) -> list[float]:
        bad = [t for t in value if not 0.0 < t <= 1.0]
        if bad:
            raise ValueError(f"tau values must be in (0, 1] (got {bad})")
        return sorted(set(value), reverse=True)

    def engine_args(self) -> dict:
        """vLLM arguments shared by every configuration."""
        return {
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "enforce_eager": self.enforce_eager,
            "seed": 0,
            "max_num_seqs": max(self.batches),
        }

    def fingerprint(self) -> str:
        """Hash of what makes two runs' cells comparable (not which configurations are run)."""
        keys = ("target", "drafter", "workloads", "humaneval_problems", "humaneval_format", "general_limit",
                "max_tokens", "max_model_len", "enforce_eager", "dtype")
        data = {k: getattr(self, k) for k in keys}
        # Math and the copying workloads enter only when they run, so runs without them keep the fingerprint
        # they had before these existed.
        if "math" in self.workloads:
            data.update(math_limit=self.math_limit, math_seed=self.math_seed)
        for workload in ("edit", "quote", "mixed"):
            if workload in self.workloads:
                data[f"{workload}_limit"] = getattr(self, f"{workload}_limit")
        optional = {"math", "edit", "quote", "mixed"} - set(self.workloads)
        data["max_tokens"] = {k: v for k, v in self.max_tokens.items() if k not in optional}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
