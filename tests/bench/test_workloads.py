"""The two workloads: HumanEval from the package, the project's general prompts, answer grading."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from vllm_adaptivespec.bench.settings import QUICK_HUMANEVAL
from vllm_adaptivespec.bench.workloads import GENERAL_PROMPTS, final_answer_correct, general_items, humaneval_items


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
    for r in records:
        if r["category"] == "word_problem":
            assert final_answer_correct(f"So the answer is {r['answer']}.", r["answer"]), r


def test_general_subset_is_fixed_and_spread():
    subset = general_items(8)
    assert len(subset) == 8 and [i.id for i in subset] == [i.id for i in general_items(8)]
    assert len({i.id.rsplit("-", 1)[0] for i in subset}) >= 4


@pytest.mark.parametrize("text,answer,ok", [
    ("It arrives at 5:15 pm.", "5:15", True),
    ("Leaving at 2:15 and taking 3 hours, it arrives at 5:15.", "5:15", True),
    ("The sale price is $30.00.", "30", True),
    ("Each pays 29 + 4 = 33 dollars", "33", True),
    ("The total is 1,250 grams... wait, 600 grams.", "600", True),
    ("Tom is 16. In 5 years he will be 21.", "16", False),
    ("no numbers here", "3", False),
])
def test_final_answer_rule(text, answer, ok):
    assert final_answer_correct(text, answer) is ok
