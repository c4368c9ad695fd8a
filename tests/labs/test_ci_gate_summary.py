"""``CommandRun.summary``: notebook 07 quotes pytest's closing line, which is not always the last."""

from labs.ci_gate_lab import CommandRun


def run(output: str) -> CommandRun:
    return CommandRun(["pytest"], 1, output, 0.1)


def test_the_counts_line_beats_a_warning_printed_at_exit():
    out = "E   L0.q  float32  0.005\n1 failed, 1 passed, 2 warnings in 4.36s\nsys:1: DeprecationWarning: swigvarlink\n"
    assert run(out).summary == "1 failed, 1 passed, 2 warnings in 4.36s"


def test_an_assertion_line_with_counts_words_is_not_the_summary():
    assert run("3 passed in 1.0s\nE   assert '2 failed' in text\n").summary == "3 passed in 1.0s"


def test_without_a_counts_line_the_last_line_stands():
    assert run("ImportError while loading conftest\n").summary == "ImportError while loading conftest"
