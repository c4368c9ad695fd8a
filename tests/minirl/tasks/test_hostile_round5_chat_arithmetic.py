"""Hostile inputs, round 5 (issue 65), chat_arithmetic's verifier with ``min_words`` 5 on 3 + 4: the
length floor, the last integer, and a 5,000-digit number scored False instead of raising (CA07).
The readings of odd completions are the ones the module docstring documents. Named by case id (CA)."""

from __future__ import annotations

import random

import pytest

from minirl.tasks.base import Problem
from minirl.tasks.chat_arithmetic import ChatArithmetic

TASK = ChatArithmetic(digits=1, second_digits=1, min_words=5)
SEVEN = Problem("What is 3 + 4? Explain your answer in at least 5 words, then give the number.", "7", {"value": 7})
HUGE = "9" * 5000


@pytest.mark.parametrize("case, completion, right", [
    ("CA01", "The answer is 7.", False),  # 4 words: below the floor
    ("CA02", "7", False),
    ("CA03", "a a a a 7", True),
    ("CA05", "We have 3 + 4 = 7, so", True),
    ("CA06", "seven is the answer to 3+4, 7", True),
    ("CA11", "The answer: 1,2,3,4 then 7", True),  # thousands commas dropped: 1234, then 7
    ("CA04", "The answer is 7.0 which is seven", False),  # documented: "7.0" ends in the integer 0
    ("CA07", f"{HUGE} is not it, it is 7 or {HUGE}", False),
    ("CA08", "the answer is surely \u0667 here", True),  # Arabic-Indic seven reads as 7
    ("CA09", "\u00a0the\u00a0answer\u00a0is\u00a07\u00a0", False),  # NBSP separates: 4 words
    ("CA10", "so the answer is 7\u200b\u200b", True),  # zero-width spaces join nothing to the digit
    ("CA12", "-7 but really it is 7-0", False),  # documented: the last integer of "7-0" is -0
])
def test_CA01_CA12_the_verifier_reads_as_documented(case, completion, right):
    assert TASK.verify(SEVEN, completion) is right


def test_CA07_a_5000_digit_answer_is_false_even_when_it_is_the_value():
    """No exception from Python's 4,300-digit int limit, whichever side of the comparison it is on."""
    problem = Problem("What is a huge sum?", HUGE, {"value": 7})
    assert TASK.verify(problem, f"the answer is clearly this {HUGE}") is False


def test_CA13_one_digit_problems_number_155():
    rng = random.Random(0)
    assert len({TASK.sample(rng).prompt for _ in range(10_000)}) == 155
