"""Checked math: the generator is deterministic and varied, every answer agrees with a brute-force
recomputation written here (loops, counting and search over the problem's numbers, not the generator's
formulas), and replies' answers are read back exactly."""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

import pytest

from vllm_adaptivespec.bench.math_problems import (
    DEFAULT_COUNT, INSTRUCTION, KINDS, answer_correct, extract_answer, generate, prompt,
)


def _whole(value: Fraction) -> int:
    assert value.denominator == 1, f"not a whole number: {value}"
    return int(value)


def _count_down(total: int, piece: int) -> int:
    """Whole pieces of ``piece`` in ``total``, by taking them off one at a time."""
    pieces = 0
    while total >= piece:
        total -= piece
        pieces += 1
    return pieces


def _shopping(p: dict) -> int:
    bill = 0
    for _ in range(p["n1"]):
        bill += p["p1"]
    for _ in range(p["n2"]):
        bill += p["p2"]
    off = sum(Fraction(bill, 100) for _ in range(p["percent"]))  # one percent at a time
    return _whole(bill - off) - p.get("coupon", 0)


def _travel(p: dict) -> int:
    km = Fraction(0)
    for _ in range(60 * p["t1"]):  # minute by minute
        km += Fraction(p["s1"], 60)
    for _ in range(p["minutes"]):
        km += Fraction(p["s2"], 60)
    return _whole(p["route"] - km) if "route" in p else _whole(km)


def _deal(p: dict) -> tuple[int, int]:
    """(each friend's share, left over), dealing one round of one item per friend at a time."""
    items = sum(p["each"] for _ in range(p["containers"])) - p["lost"]
    each = 0
    while items >= p["friends"]:
        items -= p["friends"]
        each += 1
    return each, items


def _times_and_sum(p: dict) -> int:
    found = [p["times"] * young for young in range(1, 300)
             if p["times"] * young + young + 2 * p["years"] == p["total"]]
    assert len(found) == 1
    return found[0]


def _gap_and_times(p: dict) -> int:
    found = [young for young in range(p["years"] + 1, 300)
             if young + p["gap"] - p["years"] == p["times"] * (young - p["years"])]
    assert len(found) == 1
    return found[0]


def _films(p: dict) -> int:
    clock = 0
    for film in range(p["films"]):
        if film:
            clock += p["pause"]
        for _ in range(p["hours"]):
            clock += 60
        clock += p["minutes"]
    return clock


def _inventory(p: dict) -> int:
    shelf = ["unit"] * p["start"]
    for event in p["events"]:
        if event[0] == "receive":
            for _ in range(event[1]):
                shelf.extend(["unit"] * event[2])
        elif event[0] == "ship":
            assert 0 < event[1] <= len(shelf)
            shelf = shelf[: len(shelf) - event[1]]
        else:
            assert len(shelf) % event[1] == 0
            shelf = shelf[: len(shelf) - len(shelf) // event[1]]
    return len(shelf)


def _percent_of(amount: Fraction, percent: int) -> Fraction:
    return sum((amount / 100 for _ in range(percent)), Fraction(0))


def _of_a_part(p: dict) -> int:
    sport = _whole(_percent_of(Fraction(p["people"]), p["p"]))
    return _whole(_percent_of(Fraction(sport), p["q"]))


def _up_then_down(p: dict) -> int:
    raised = _whole(p["price"] + _percent_of(Fraction(p["price"]), p["up"]))
    return _whole(raised - _percent_of(Fraction(raised), p["down"]))


def _pipes(p: dict) -> int:
    level, minutes = 0, 0
    while level < p["tank"]:
        level += p["a"] + p["b"] - p["leak"]
        minutes += 1
    assert level == p["tank"]
    return minutes


def _two_workers(p: dict) -> int:
    done, hours = Fraction(0), 0
    while done < 1:
        done += Fraction(1, p["x"]) + Fraction(1, p["y"])
        hours += 1
    assert done == 1
    return hours


def _lawn(p: dict) -> int:
    squares = sum(1 for i in range(p["length"]) for j in range(p["width"]) if not (i < p["side"] and j < p["side"]))
    return squares * p["cost"]


def _tiles(p: dict) -> int:
    across, rem_a = divmod(100 * p["length"], p["tile"])
    down, rem_d = divmod(100 * p["width"], p["tile"])
    assert rem_a == rem_d == 0  # whole tiles fit
    tiles = sum(1 for _ in range(across) for _ in range(down))
    boxes = 0
    while boxes * p["per_box"] < tiles:
        boxes += 1
    return boxes


def _overtime(p: dict) -> int:
    pay = Fraction(0)
    for hour in range(1, p["hours"] + 1):
        pay += p["wage"] if hour <= 40 else Fraction(3, 2) * p["wage"]
    return _whole(pay) - p["rent"] - p["food"]


def _next_score(p: dict) -> int:
    found = [x for x in range(0, 101) if Fraction(sum(p["scores"]) + x, len(p["scores"]) + 1) == p["target"]]
    assert len(found) == 1
    return found[0]


REFERENCE = {
    ("shopping", "discount"): _shopping,
    ("shopping", "discount-then-coupon"): _shopping,
    ("travel", "total"): _travel,
    ("travel", "remaining"): _travel,
    ("sharing", "share"): lambda p: _deal(p)[0],
    ("sharing", "leftover"): lambda p: _deal(p)[1],
    ("ages", "times-and-sum"): _times_and_sum,
    ("ages", "gap-and-times"): _gap_and_times,
    ("units", "ribbon"): lambda p: _count_down(12 * p["feet"] + p["inches"], p["piece"]),
    ("units", "flour"): lambda p: _count_down(1000 * p["kilos"] + p["grams"], p["batch"]),
    ("units", "films"): _films,
    ("inventory", "days"): _inventory,
    ("percentages", "of-a-part"): _of_a_part,
    ("percentages", "up-then-down"): _up_then_down,
    ("together", "pipes"): _pipes,
    ("together", "two-workers"): _two_workers,
    ("areas", "lawn"): _lawn,
    ("areas", "tiles"): _tiles,
    ("wages", "overtime"): _overtime,
    ("averages", "next-score"): _next_score,
}


@pytest.fixture(scope="module")
def problems():
    return generate()


def _stated_numbers(params: dict) -> list[int]:
    """The numbers a problem's text must state (an inventory's shares are stated in words)."""
    out = []
    for key, value in params.items():
        if key == "events":
            out += [n for event in value for n in (event[1:] if event[0] != "fraction" else [])]
        elif isinstance(value, list):
            out += value
        else:
            out.append(value)
    return out


def test_same_seed_same_problems_and_prefixes_agree(problems):
    assert generate() == problems and generate(DEFAULT_COUNT, seed=0) == problems
    assert generate(50) == problems[:50]
    other = generate(seed=1)
    assert len(other) == DEFAULT_COUNT and sum(a.question != b.question for a, b in zip(problems, other)) > 200


def test_many_distinct_problems_of_many_kinds(problems):
    assert len(problems) == 240 and len({p.question for p in problems}) == 240 and len({p.id for p in problems}) == 240
    kinds = Counter(p.kind for p in problems)
    assert len(KINDS) >= 8 and set(kinds) == set(KINDS) and min(kinds.values()) >= 240 // len(KINDS)
    assert len({(p.kind, p.variant) for p in problems}) >= 16  # several wordings per kind
    assert len({p.answer for p in problems}) >= 120  # varied numbers, not a few repeated answers
    assert len(generate(1000, seed=7)) == 1000  # far more problems to draw than the default asks


def test_every_answer_matches_a_brute_force_recomputation(problems):
    checked = Counter()
    for problem in problems:
        reference = REFERENCE[(problem.kind, problem.variant)]
        assert reference(problem.params) == problem.answer, problem
        assert isinstance(problem.answer, int) and problem.answer >= 0
        checked[problem.kind] += 1
    assert set(checked) == set(KINDS)
    assert {(p.kind, p.variant) for p in problems} == set(REFERENCE)  # every wording is checked


def test_the_text_states_the_numbers_the_answer_follows_from(problems):
    for problem in problems:
        stated = Counter(int(n) for n in re.findall(r"\d+", problem.question))
        for number in _stated_numbers(problem.params):
            assert stated[number] > 0, (number, problem.question)
        if problem.kind == "inventory":  # one sentence per day's event
            assert problem.question.count("On ") == len(problem.params["events"])


def test_prompt_asks_for_a_final_answer_line(problems):
    text = prompt(problems[0])
    assert text.startswith(INSTRUCTION) and text.endswith(problems[0].question)
    assert "Answer: <number>" in text


@pytest.mark.parametrize("text,expected", [
    ("3 boxes of 4 is 12, minus 2 is 10.\nAnswer: 10", 10),
    ("Answer: 10\nCheck: 2 + 8 = 10, and 7 more is 17.", 10),  # the number after Answer:, not the last one
    ("First guess Answer: 4. Correction: Answer: 6 apples", 6),  # the last Answer: counts
    ("**Answer:** 42", 42),
    ("answer = 7", 7),
    ("The total is 1,250 dollars.", 1250),  # no Answer: line: the last number
    ("Answer: $1,234,567", 1234567),
    ("Answer: -15", -15),
    ("Answer: \u221215", -15),
    ("The balance falls to -8", -8),
    ("pages 3-4", 4),  # a dash between numbers is not a minus sign
    ("Answer: +9", 9),
    ("Answer: 30.00", 30),
    ("Answer: 12.0.", 12),
    ("Answer: 12.5", None),  # not a whole number
    ("So it is 7.", 7),
    ("no number at all", None),
    ("Answer: none of these", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_answer_correct_is_exact():
    assert answer_correct("Answer: 1,000", 1000) and answer_correct("Answer: 1000.0", 1000)
    assert not answer_correct("Answer: 1000.5", 1000) and not answer_correct("Answer: 999", 1000)
    assert not answer_correct("nothing", 0)
