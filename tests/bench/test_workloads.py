"""The workloads: HumanEval from the package, the project's general prompts (speed only), checked math."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from vllm_adaptivespec.bench.math_problems import generate, prompt
from vllm_adaptivespec.bench.settings import QUICK_HUMANEVAL
from vllm_adaptivespec.bench.workloads import (
    GENERAL_PROMPTS, WORKLOADS, general_items, humaneval_items, load, math_items,
)


def test_humaneval_has_all_164_problems_and_the_quick_subset():
    items = humaneval_items()
    assert len(items) == 164 and items[0].id == "HumanEval/0" and items[-1].id == "HumanEval/163"
    quick = humaneval_items(QUICK_HUMANEVAL)
    assert [i.id for i in quick] == [f"HumanEval/{n}" for n in QUICK_HUMANEVAL]
    item = quick[0]
    assert item.answer_prefix.startswith("```python\n") and item.answer_prefix.endswith(item.reference["prompt"])
    assert item.reference["prompt"] not in item.messages[0]["content"]  # once, in the answer's opening
    restated = humaneval_items(QUICK_HUMANEVAL, form="restate")[0]
    assert restated.reference["prompt"] in restated.messages[0]["content"]
    with pytest.raises(ValueError, match="no such HumanEval problems"):
        humaneval_items([999])


def test_general_prompts_are_many_diverse_and_well_formed():
    records = json.loads(GENERAL_PROMPTS.read_text())["prompts"]
    assert len(records) >= 50
    assert len({r["id"] for r in records}) == len(records)
    assert len({r["prompt"] for r in records}) == len(records)
    categories = Counter(r["category"] for r in records)
    for needed in ("explanation", "story", "word_problem", "summary"):
        assert categories[needed] >= 5, categories
    assert not any("answer" in r for r in records)  # nothing here is graded


def test_general_subset_is_fixed_and_spread():
    subset = general_items(8)
    assert len(subset) == 8 and [i.id for i in subset] == [i.id for i in general_items(8)]
    assert len({i.id.rsplit("-", 1)[0] for i in subset}) >= 4
    assert all(i.reference == {} for i in general_items())  # speed only


def test_math_workload_items_carry_their_answers():
    items = load("math", math_limit=None)
    problems = generate()
    assert "math" in WORKLOADS and len(items) == len(problems) == 240
    for item, problem in zip(items, problems):
        assert item.id == problem.id and item.reference == {"answer": problem.answer, "kind": problem.kind}
        assert item.messages == [{"role": "user", "content": prompt(problem)}]
        assert "Answer: <number>" in item.messages[0]["content"] and not item.answer_prefix
    subset = math_items(11)
    assert [i.id for i in subset] == [i.id for i in items[:11]]
    assert len({i.reference["kind"] for i in subset}) == 11  # the first few mix the kinds
    assert len(math_items(4)) == 4 and len(math_items(1000)) == 240
    assert [i.messages for i in math_items(4, seed=1)] != [i.messages for i in math_items(4)]
