"""A NaN blow-up that wipes whole rows on one side fails; only sparse sites may miss rows."""

from __future__ import annotations

import numpy as np

import aligntools
from tests.aligntools.analyzer.analyzer_synth import make_capture


def test_whole_nan_rows_at_a_hidden_site_fail_and_name_the_site():
    a = make_capture(seed=0)
    ds = a.copy(deep=True)
    ds["L1.resid_post"][:3] = np.nan  # NaN spreads through RMSNorm: whole rows go NaN
    cmp = aligntools.compare(a, ds)
    assert not cmp.passes
    assert "L1.resid_post" in cmp.failures


def test_missing_logit_rows_on_one_side_are_not_a_failure():
    a = make_capture(seed=0)
    ds = a.copy(deep=True)
    ds["logits"][:2] = np.nan  # e.g. prompt rows that a generate capture never computed
    cmp = aligntools.compare(a, ds)
    assert "logits" not in cmp.failures
