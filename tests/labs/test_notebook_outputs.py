"""What the new notebooks must show: checks on the outputs of their tagged cells.

``tests/test_notebooks.py`` executes each notebook once and calls ``OUTPUT_CHECKS[name](nb)``, so
the assertions read the outputs of that run (no second execution). A cell is found by its
``metadata.tags``; a check asserts that a table has the expected rows, a figure was produced and
a number is in a sane range.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output


def tagged(nb: nbformat.NotebookNode, tag: str) -> list[dict]:
    """Outputs of the code cell tagged ``tag`` (exactly one such cell must exist)."""
    cells = [c for c in nb.cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged {tag!r}, found {len(cells)}"
    return cells[0].get("outputs", [])


def text(outputs: list[dict]) -> str:
    return "\n".join(o.get("data", {}).get("text/plain", "") or o.get("text", "") for o in outputs)


def has_image(outputs: list[dict]) -> bool:
    return any("image/png" in o.get("data", {}) for o in outputs)


def row(outputs: list[dict], label: str) -> list[float]:
    """The numeric cells of the text/plain table row starting with ``label`` (words skipped),
    joined over the blocks pandas wraps a wide table into."""
    lines = [line.strip() for line in text(outputs).splitlines()
             if line.strip().startswith(label) and line.strip()[len(label):][:1] in ("", " ")]
    assert lines, f"no row {label!r} in:\n{text(outputs)}"
    return [float(tok) for line in lines for tok in line[len(label):].split() if _is_number(tok)]


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def check_02(nb: nbformat.NotebookNode) -> None:
    for tag in ("checklist-fp32", "checklist-bf16"):
        out = tagged(nb, tag)
        assert has_image(out), tag
        for knob in ("rmsnorm", "rope", "expert_sum_order", "residual (dtype)"):
            assert knob in text(out), (tag, knob)
    assert "lm_head_dtype" in text(tagged(nb, "checklist-fp32"))
    assert 0 < row(tagged(nb, "checklist-fp32"), "lm_head_dtype")[0] < 0.1  # gap_alone, nats/token
    assert row(tagged(nb, "checklist-bf16"), "residual (dtype)")[0] == 0.0  # all knobs: bit-identical
    drift = tagged(nb, "decode-drift")
    assert has_image(drift) and all(0 < x < 0.1 for x in row(drift, "first quarter"))
    tp = tagged(nb, "tp-drift")
    assert has_image(tp) and row(tp, "1") == [0.0, 0.0] and 1e-4 < row(tp, "2")[0] < 0.1
    assert text(tagged(nb, "vllm")) or any(o.get("output_type") == "stream" for o in tagged(nb, "vllm"))


def check_05(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "c3po-summary")
    assert has_image(out)
    sync, c3po = row(out, "synchronous"), row(out, "C3PO++")
    assert sync[0] > 0 and c3po[0] > 0  # rollout seconds per step
    assert 0.05 < sync[0] / c3po[0] < 20  # the speedup is measured, whatever it is
    assert c3po[-1] > sync[-1]  # a resume re-prefills: more prefilled tokens per sampled token
    training = tagged(nb, "c3po-training")
    assert has_image(training)
    for arm in ("synchronous", "C3PO++"):
        rollout_s, step_s, tokens, reward, accuracy = row(training, arm)
        assert 0 < rollout_s <= step_s and tokens > 0 and 0 <= reward <= 1 and 0 <= accuracy <= 1


def check_07(nb: nbformat.NotebookNode) -> None:
    codes = tagged(nb, "exit-codes")
    t = text(codes)
    assert re.search(r"aligned fp32\s+0\b", t) and re.search(r"typical bf16\s+1\b", t) and re.search(r"bad path\s+2\b", t), t
    assert has_image(tagged(nb, "report-plot"))
    assert "srcdoc" in "".join(o.get("data", {}).get("text/html", "") for o in tagged(nb, "report-inline"))
    assert "exit code 1" in text(tagged(nb, "pytest-run")) and "1 failed, 1 passed" in text(tagged(nb, "pytest-run"))


def check_08(nb: nbformat.NotebookNode) -> None:
    out = text(tagged(nb, "outcomes"))
    for outcome in ("stdout", "no_stdout", "error", "timeout"):
        assert re.search(rf"\s{outcome}\s", out), outcome
    sel = tagged(nb, "selection")
    assert "kept_by_roc" in text(sel) and sum(1 for line in text(sel).splitlines()[1:] if line.rstrip().endswith("True")) == 4
    curves = tagged(nb, "roc-curves")
    assert has_image(curves)
    for arm in ("GRPO-RoC", "GRPO"):
        first, last, acc = row(curves, arm)
        assert 0 <= first <= 1 and 0 <= last <= 1 and 0.3 < acc <= 1


OUTPUT_CHECKS: dict[str, Callable[[nbformat.NotebookNode], None]] = {
    "02_alignment_checklist.ipynb": check_02, "05_c3po_budget_rollouts.ipynb": check_05,
    "07_ci_gate.ipynb": check_07, "08_grpo_roc_tools.ipynb": check_08,
}


def _nb(tag: str, plain: str, png: bool = True) -> nbformat.NotebookNode:
    data = {"text/plain": plain, **({"image/png": "iVBORw0KGgo="} if png else {})}
    cell = new_code_cell("x", metadata={"tags": [tag]}, outputs=[new_output("display_data", data=data)])
    return new_notebook(cells=[cell])


def test_row_reads_numbers_after_the_label():
    nb = _nb("t", "      mean  max\ntp\n1  0.000000  0.0\n2  4.2e-03  0.026\n2x  9  9")
    assert row(tagged(nb, "t"), "2") == [4.2e-03, 0.026] and has_image(tagged(nb, "t"))


def test_missing_tag_or_row_fails_loudly():
    nb = _nb("t", "a 1", png=False)
    with pytest.raises(AssertionError):
        tagged(nb, "other")
    with pytest.raises(AssertionError):
        row(tagged(nb, "t"), "b")
    assert not has_image(tagged(nb, "t"))


def test_every_new_notebook_has_a_check():
    from tests.notebook_runner import NOTEBOOKS

    assert set(OUTPUT_CHECKS) <= {p.name for p in NOTEBOOKS.glob("*.ipynb")}


def check_03(nb: nbformat.NotebookNode) -> None:
    flips = tagged(nb, "routing-flips")
    assert has_image(flips)
    for layer in ("0", "1", "2", "3"):
        n_tokens, k, set_flip, *_ = row(flips, layer)
        assert n_tokens > 0 and k >= 1 and 0 <= set_flip <= 1
    assert has_image(tagged(nb, "explorer"))
    replay = tagged(nb, "replay")
    assert has_image(replay)
    none, r2, r3 = row(replay, "no replay"), row(replay, "R2"), row(replay, "R3")
    assert r2[:2] == none[:2]  # R2 at equal weights is the trainer's own routing
    assert 0 < r3[0] <= none[0] < 0.5 and r3[-1] >= 1  # mean |dlogprob| shrinks; reduction >= 1


def check_04(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "icepop-summary")
    assert has_image(out)
    arms = {arm: row(out, arm) for arm in ("GRPO", "TIS", "IcePop")}
    assert arms["GRPO"][-1] == 0 and 0 <= arms["IcePop"][-1] <= 1000  # masked per mille
    assert all(0 < v[3] < 1 for v in arms.values())  # mismatch KL: injected, finite, small
    sweep = tagged(nb, "masked-sweep")
    assert has_image(sweep)
    labels = list(dict.fromkeys(line.split()[0] for line in text(sweep).splitlines() if re.match(r"\d+\.\d+\s", line)))
    clean, noisy = row(sweep, labels[0]), row(sweep, labels[-1])  # noise 0 and the largest noise
    assert clean[0] > 100 and noisy[1] > clean[1] and noisy[3] > clean[3]  # more noise: more KL, more masked


def check_09(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "async-summary")
    assert has_image(out)
    sync, async_ = row(out, "sync"), row(out, "async")
    assert sync[0] > 0 and async_[0] > 0 and async_[3] <= 1 and 0.2 < async_[-1] < 5  # staleness, speedup
    assert has_image(tagged(nb, "timelines"))
    model = tagged(nb, "cost-model")
    assert has_image(model) and all(1 <= row(model, w)[-1] <= 2 for w in ("1", "64"))


OUTPUT_CHECKS.update({"03_moe_routing_and_replay.ipynb": check_03, "04_icepop_tis_grpo.ipynb": check_04,
                      "09_async_scale_out.ipynb": check_09})
