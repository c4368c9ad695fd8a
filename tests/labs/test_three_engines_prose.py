"""labs.three_engines' reading: every direction in it follows from the table (hand-made tables)."""

from __future__ import annotations

import pandas as pd
import pytest

from labs.three_engines import ThreeEngines, closest, modelled, sentence


def result(gaps: dict[str, float], distances: dict[str, float]) -> ThreeEngines:
    rows = [{"engine": e, "first_divergence": "embed", "dlogprob_mean": g, "logits_rel_l2": 0.01,
             "fingerprint_distance": distances[e], "knobs_found": "attention=sdpa", "gap_start": "L0.q"}
            for e, g in gaps.items()]
    return ThreeEngines(pd.DataFrame(), pd.DataFrame(rows).set_index("engine"))


def test_the_closest_engine_or_a_tie_within_five_percent():
    clear = result({"vllm:bfloat16": 0.040, "sglang:bfloat16": 0.030, "minirl:typical": 0.050},
                   dict.fromkeys(("vllm:bfloat16", "sglang:bfloat16", "minirl:typical"), 0.0))
    assert closest(clear) == ("Closest to the trainer at the log-probs: `sglang:bfloat16` (0.03 nats/token; then "
                              "`vllm:bfloat16` 0.04, `minirl:typical` 0.05)")
    tie = result({"vllm:bfloat16": 0.041, "sglang:bfloat16": 0.040}, {"vllm:bfloat16": 0.0, "sglang:bfloat16": 0.0})
    assert "neither is clearly closest" in closest(tie)  # 2.4 % apart


@pytest.mark.parametrize(("distance", "words"), [(0.009, "models it **closely**"), (0.02, "models it **only roughly**"),
                                                 (0.046, "does **not** model it")])
def test_how_well_minirl_models_an_engine_is_its_share_of_the_gap(distance, words):
    assert modelled(distance, 0.040) == words
    text = sentence(result({"vllm:bfloat16": 0.040, "minirl:typical": 0.045},
                           {"vllm:bfloat16": distance, "minirl:typical": 0.0}))
    assert f"`vllm:bfloat16`: the closest minirl setting (attention=sdpa) stays {distance:.2g}" in text and words in text
    assert "`minirl:typical`: the closest" not in text  # minirl is its own model: not judged
    assert "First divergence: `vllm:bfloat16` at `embed`, `minirl:typical` at `embed`." in text
