"""Addition and subtraction asked in words, for instruct models: ``What is 37 + 5? Answer with
just the number.``

``minirl.training.sft.encode`` sends the prompt as a user turn of the model's chat template. An instruct
model still answers in a sentence ("The answer is 42."), so the verifier reads the last integer
of the completion (the GSM8K convention) instead of the first line that ``arithmetic`` reads.
Operand sizes set the difficulty: SmolLM2-135M is right on ~3 % of 2-digit ± 2-digit problems and
~73 % of 1-digit ones (docs/measurements/2026-11-26-real-model-rl.md); RL needs a start in between.

``min_words`` is a length floor: the prompt asks for an explanation of at least that many words, and
a shorter completion scores 0 however right its number. Without it, RL on this task shrinks the
completions to the bare number (~9 tokens within 30 steps, docs/measurements/2026-12-02-collapse-arms.md),
and a train-inference mismatch has nothing to compound over.

How the verifier reads odd completions (words are what ``str.split`` separates): a decimal is read
by its last integer ("7.0" ends in the integer 0: an answer is written as an integer, as asked);
any script's decimal digits count (Arabic-Indic "٧" is 7); non-breaking spaces separate words,
zero-width spaces do not (and sit beside a digit without hiding it); "7-0" is 7 then -0, so its last
integer is 0; an integer longer than Python converts (4,300 digits) is no answer (False, never an
exception). 1-digit ± 1-digit has 155 distinct problems (100 sums and 55 differences with the larger
operand first), so ``n_train + n_eval`` above that is refused when the splits are drawn.
"""

from __future__ import annotations

import random
import re
import sys
from dataclasses import dataclass

from minirl.tasks.base import Problem

_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ChatArithmetic:
    """First operand with exactly ``digits`` digits, second with exactly ``second_digits`` (1 digit:
    0-9); ``a - b`` keeps the larger first, so results are >= 0."""

    digits: int = 2
    second_digits: int = 1
    min_words: int = 0
    name: str = "chat_arithmetic"

    def __post_init__(self) -> None:
        for key in ("digits", "second_digits"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 9:
                raise ValueError(f"chat_arithmetic {key}={value!r}: must be an int in [1, 9]; e.g. "
                                 f"task_kwargs: {{digits: 2, second_digits: 1}}")
        if not isinstance(self.min_words, int) or isinstance(self.min_words, bool) or not 0 <= self.min_words <= 200:
            raise ValueError(f"chat_arithmetic min_words={self.min_words!r}: must be an int in [0, 200] (0: no "
                             f"length floor); e.g. task_kwargs: {{digits: 1, second_digits: 1, min_words: 10}}")

    def sample(self, rng: random.Random) -> Problem:
        a, b = _operand(rng, self.digits), _operand(rng, self.second_digits)
        ask = (f"Explain your answer in at least {self.min_words} words, then give the number." if self.min_words
               else "Answer with just the number.")
        if rng.random() < 0.5:
            return Problem(f"What is {a} + {b}? {ask}", str(a + b), {"value": a + b})
        a, b = max(a, b), min(a, b)
        return Problem(f"What is {a} - {b}? {ask}", str(a - b), {"value": a - b})

    def verify(self, problem: Problem, completion: str) -> bool:
        return len(completion.split()) >= self.min_words and last_integer(completion) == problem.meta["value"]


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits - 1)


def last_integer(text: str) -> int | None:
    """The last integer written in ``text`` (thousands commas ignored; any script's decimal digits, as
    ``int`` reads them: Arabic-Indic ``٧`` is 7), None when there is none or when it has more digits
    than Python converts (``sys.get_int_max_str_digits()``, 4,300): no answer here is that long, and a
    completion of 5,000 digits must score False, not raise ValueError out of the verifier."""
    found = _INTEGER.findall(text.replace(",", ""))
    if not found:
        return None
    sign, digits = ("-", found[-1][1:]) if found[-1].startswith("-") else ("", found[-1])
    digits = digits.lstrip("0") or "0"
    limit = sys.get_int_max_str_digits()
    return int(sign + digits) if not limit or len(digits) <= limit else None
