"""labs.narrate: each generated claim on both sides of its threshold."""

from __future__ import annotations

import math
import statistics

import pytest

from labs import narrate


def test_direction_resolves_a_clear_difference_both_ways():
    fast, slow = [1.0, 1.1, 0.9], [3.0, 3.1, 2.9]
    assert narrate.direction(fast, slow) == "less"
    assert narrate.direction(slow, fast) == "more"


def test_direction_calls_a_difference_inside_two_standard_errors_noise():
    a, b = [2.0, 18.0, 7.9], [5.0, 9.6, 7.3]  # the 2-18 s swings
    se = math.hypot(statistics.stdev(a) / math.sqrt(3), statistics.stdev(b) / math.sqrt(3))
    assert abs(statistics.mean(a) - statistics.mean(b)) < 2 * se  # hand check: inside the noise
    assert narrate.direction(a, b) == "noise"


def test_direction_with_one_sample_each_goes_by_the_sign():
    assert narrate.direction([1.0], [2.0]) == "less" and narrate.direction([2.0], [2.0]) == "noise"


def test_compare_times_says_more_time_when_the_candidate_is_slower():
    text = narrate.compare_times("C3PO++", [9.2, 9.3, 9.3], "synchronous", [7.3, 7.3, 7.33])
    assert "more time**" in text and "less" not in text
    assert f"{9.2667 / 7.31:.2f}x" in text  # ratio >= 1, never "0.79x less"


def test_compare_times_says_less_time_only_when_it_is_less():
    text = narrate.compare_times("C3PO++", [5.0, 5.1, 4.9], "synchronous", [7.3, 7.4, 7.2])
    assert "less time**" in text and f"{7.3 / 5.0:.2f}x" in text


def test_compare_times_reports_noise_with_the_measured_spread():
    text = narrate.compare_times("C3PO++", [2.0, 18.0, 7.9], "synchronous", [5.0, 9.6, 7.3])
    assert "inside run-to-run noise" in text and "2.00-18.00 s" in text and "**" not in text


def test_compare_times_with_one_step_says_noise_is_unmeasured():
    assert "unmeasured" in narrate.compare_times("a", [1.0], "b", [1.0])


def test_speedup_vs_paper_follows_the_verdict():
    assert narrate.speedup_vs_paper("more", 0.79, 2.5).startswith("slower (")
    assert narrate.speedup_vs_paper("noise", 1.23, 2.5).startswith("no speedup resolved")
    assert "less than the paper" in narrate.speedup_vs_paper("less", 1.5, 2.5)
    assert "as much as" in narrate.speedup_vs_paper("less", 2.4, 2.5)  # within 10 %
    assert not narrate.reproduces("less", 2.2, 2.5) and narrate.reproduces("less", 2.3, 2.5)
    assert not narrate.reproduces("noise", 3.0, 2.5)


def test_trend_grows_only_past_the_fold_and_the_noise():
    assert narrate.trend(3.41, 3.16).startswith("stays flat")  # the flat sweep
    assert narrate.trend(1.0, 1.49).startswith("stays flat") and narrate.trend(1.0, 1.51).startswith("grows")
    assert narrate.trend(10.0, 2.0).startswith("falls")
    assert "inside the noise" in narrate.trend(0.1, 0.5, noise=1.0)


def test_share_noise_is_the_binomial_standard_error():
    p, n = 0.00341, 4096
    assert narrate.share_noise(3.41, n) == pytest.approx(2 * 1000 * math.sqrt(p * (1 - p) / n))
    with pytest.raises(ValueError, match="tokens > 0"):
        narrate.share_noise(1.0, 0)


def test_reduction_words_on_each_side_of_the_thresholds():
    assert narrate.reduction(1.0, 0.099).startswith("removes")
    assert narrate.reduction(1.0, 0.11).startswith("cuts") and "1.2x" in narrate.reduction(1.2, 1.0)
    assert narrate.reduction(1.0, 1.05).startswith("leaves")
    assert narrate.reduction(1.0, 1.2).startswith("makes")
    assert narrate.reduction(1.0, 0.0) == "removes the gap entirely"


def test_magnitude_same_order_within_three_x():
    assert "same order" in narrate.magnitude(2.9, 1.0, "a", "b")
    assert "4x larger" in narrate.magnitude(4.0, 1.0, "a", "b")
    assert "10x smaller" in narrate.magnitude(0.1, 1.0, "a", "b")


def test_peaks_names_every_arm_largest_first():
    text = narrate.peaks("grad norm", {"IcePop": 1.7, "GRPO": 8.22, "TIS": 3.1})
    assert text == "GRPO's grad norm peaks at 8.22, TIS's at 3.1 and IcePop's at 1.7 (GRPO's is 4.8x IcePop's)"
    assert "{" not in text


def test_proportion_difference_noise_and_beyond():
    assert "within sampling noise" in narrate.proportion_difference("a", 0.50, "b", 0.55, 48)
    beyond = narrate.proportion_difference("a", 0.9, "b", 0.1, 48)
    assert "higher" in beyond and "beyond sampling noise" in beyond
    with pytest.raises(ValueError, match="rewards in"):
        narrate.proportion_difference("a", 1.5, "b", 0.1, 4)


def test_count_sentence_only_claims_some_when_some():
    assert narrate.count_sentence(0, 9, "x", "none") == "none"
    assert narrate.count_sentence(2, 9, "knobs", "none") == "2 of 9 knobs"


def test_ratio_model_against_noise():
    assert narrate.ratio_model(1.62, 0.97, 0.2) == "below"
    assert narrate.ratio_model(1.62, 1.5, 0.2) == "matches"
    assert narrate.ratio_model(1.0, 1.5, 0.2) == "above"
    # first-order error of a ratio of means: hand-computed for two samples each
    noise = narrate.ratio_noise([2.0, 4.0], [1.0, 1.0])
    assert noise == pytest.approx(2 * (1.0 / 3.0) * 3.0)


def test_bad_samples_name_the_argument():
    with pytest.raises(ValueError, match="synchronous must be a non-empty"):
        narrate.compare_times("C3PO++", [1.0], "synchronous", [])
    with pytest.raises(ValueError, match="finite"):
        narrate.direction([math.nan], [1.0])


def test_stand_out_only_claims_bright_rows_past_the_fold():
    assert "bright rows" in narrate.stand_out(1.6, 3) and "3 flipped" in narrate.stand_out(1.6, 3)
    assert "do not stand out" in narrate.stand_out(1.4, 3)
    assert narrate.stand_out(9.0, 0).startswith("no token flipped")
