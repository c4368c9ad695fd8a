"""Built-in text the tiny zoo models (and their tokenizer) are trained on.

No downloads: a short English corpus shipped inside aligntools (``aligntools/data``) plus
arithmetic question/answer lines generated from a seed, in the format the RL tasks use.
Training on it briefly gives the zoo models peaked, realistic next-token distributions
(random-init models have near-uniform logits, which hide precision effects).
"""

from __future__ import annotations

import random

from aligntools.gates.inputs import corpus_text


def arithmetic_lines(n: int, seed: int) -> list[str]:
    """``n`` lines like ``"Q: 12+7= A: 19"`` (sums and differences of 0..99)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if rng.random() < 0.5:
            lines.append(f"Q: {a}+{b}= A: {a + b}")
        else:
            a, b = max(a, b), min(a, b)
            lines.append(f"Q: {a}-{b}= A: {a - b}")
    return lines


def training_texts(seed: int = 0, n_arithmetic: int = 400) -> list[str]:
    """English corpus lines followed by seeded arithmetic lines."""
    prose = [line.strip() for line in corpus_text().splitlines() if line.strip()]
    return prose + arithmetic_lines(n_arithmetic, seed)
