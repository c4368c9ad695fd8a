"""The engine fingerprint on real vLLM bf16: which minirl knobs get closest, and where the
gap no knob explains starts."""

from __future__ import annotations

import pytest

import aligntools
from aligntools.replayer.fingerprint import fingerprint
from minirl import Knobs
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm


@pytest.fixture(scope="module")
def fp(zoo, vllm_llm, prompt_ids):
    cap = aligntools.capture(vllm_llm("tiny-llama", "bfloat16"), prompt_ids, progress=False)
    return fingerprint(cap, zoo("tiny-llama"), passes=1)


def test_fingerprint_is_at_least_as_close_as_the_presets(fp):
    assert isinstance(fp.knobs, Knobs)
    assert list(fp.table.columns) == ["hf_exact", "typical", "best"]
    assert (fp.table["best"].dropna() >= 0).all()
    assert fp.score <= min(fp.table[c].pipe(lambda s: (s.dropna() + 1e-9).apply("log10").mean())
                           for c in ("hf_exact", "typical")) + 1e-9
    assert 0 < fp.distance < 0.05  # mean |Δ logprob| in nats: bf16-sized, not a broken model


def test_fingerprint_names_the_knobs_and_where_the_gap_starts(fp):
    assert set(fp.explained.columns) == {"engine_value", "trainer_value", "distance_if_reverted", "score_if_reverted"}
    assert (fp.explained["score_if_reverted"] > fp.score).all()  # each listed knob matters
    # vLLM CPU's bf16 qkv GEMM rounds unlike torch's: the first site no knob reproduces is L0.q/k/v
    assert fp.gap_start in ("L0.q", "L0.k", "L0.v")
    assert "remaining gap starts at" in repr(fp)
