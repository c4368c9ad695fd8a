"""Hostile inputs, round 5 (issue 65), ``mlab check``: ``--exclude`` is checked before any capture
runs (a typo, ``logits``, or everything: each refused with its true reason, the names quoted), and
``--infer sglang`` specs are refused naming the token, a KV pool of 0 or less included. Named by the
round-5 case id (EX, SG). Refusals are exit 2; ``capture`` is replaced by one that fails the test,
so a refusal that came after a capture could not pass."""

from __future__ import annotations

import re

import pytest

from aligntools.gates.alignment import check_alignment, possible_sites, site_coverage
from aligntools.gates.inputs import GateUsageError, parse_infer
from aligntools.sites import ROUTING_SITES, parse
from labs import cli


@pytest.fixture
def llama(zoo):
    return zoo("tiny-llama")


@pytest.fixture
def no_capture(monkeypatch):
    """Any capture fails the test: the refusals under test come before the first one."""
    from aligntools.tracker import tracker

    def capture(*args, **kwargs):
        raise AssertionError("a capture ran before the refusal")

    monkeypatch.setattr(tracker, "capture", capture)


def _check(capsys, model, *args: str) -> str:
    """``mlab check`` refused with exit 2: its one-line message."""
    assert cli.main(["check", "--model", str(model), "--tokens", "32", *args]) == 2
    return capsys.readouterr().err


def _dense(model) -> list[str]:
    return [s for s in possible_sites(model) if parse(s).kind not in ROUTING_SITES]


def test_EX00_the_gate_says_how_many_sites_it_compared(llama):
    result = check_alignment(llama, infer="minirl:aligned", tokens=32, progress=False, exclude=["L0.q"])
    assert " of " in result.summary() and "sites compared" in result.summary() and "excluded: L0.q" in result.summary()


def test_EX01_excluding_every_site_leaves_nothing_to_compare(llama, no_capture, capsys):
    err = _check(capsys, llama, "--exclude", ",".join(_dense(llama)))
    assert "--exclude names every site (41): nothing left to compare" in err


def test_EX02_an_unknown_site_is_named_quoted_with_the_sites(llama, no_capture, capsys):
    err = _check(capsys, llama, "--exclude", "L9.nope")
    assert "--exclude 'L9.nope': no such site in either capture (sites: embed, L0.attn_norm, L0.q," in err


@pytest.mark.parametrize("case, excluded", [("EX03", ["logits"]), ("EX06", None), ("FF13", ["logits", "L0.q"])])
def test_EX03_EX06_logits_cannot_be_excluded_and_the_message_says_why(llama, no_capture, capsys, case, excluded):
    """EX06: every site but L0.q, so the message is about logits, not "the captures have no logits site"."""
    excluded = excluded or [s for s in _dense(llama) if s != "L0.q"]
    err = _check(capsys, llama, *[a for name in excluded for a in ("--exclude", name)])
    assert "--exclude logits: logits cannot be excluded, the final logprob check (the gate's third) reads it" in err
    assert "the captures have no logits site" not in err


def test_FF14_a_glob_is_not_expanded_and_says_so(llama, no_capture, capsys):
    err = _check(capsys, llama, "--exclude", "L*")
    assert "--exclude 'L*': no such site in either capture (names are exact: patterns such as 'L*' are not " \
           "expanded)" in err


def test_EX04_a_site_excluded_twice_counts_once():
    cov = site_coverage(["embed", "L0.q", "logits"], ["embed", "L0.q", "logits"], ["L0.q", "logits"],
                        exclude=["embed", "embed"])
    assert cov["excluded"] == ["embed"] and (cov["compared"], cov["total"]) == (2, 2)


def test_EX05_a_string_exclude_at_the_api_is_not_a_list_of_names(llama, no_capture):
    with pytest.raises(GateUsageError, match=r"exclude='logits': expected a list of site names, e.g. exclude=\['L0.q'\]"):
        check_alignment(llama, tokens=32, progress=False, exclude="logits")


SITES = ["embed", "L0.q", "L0.resid_post", "logits"]


@pytest.mark.parametrize("case, exclude, match", [
    ("EX20", SITES, r"--exclude names every site \(4\): nothing left to compare"),
    ("EX21", "logits", r"exclude='logits': expected a list of site names"),
    ("EX22", ["L*"], r"--exclude 'L\*': no such site in either capture \(names are exact: patterns such as 'L\*' are "
                     r"not expanded\) \(sites: embed, L0.q, L0.resid_post, logits\)"),
    ("EX23", [" logits"], r"--exclude ' logits': no such site in either capture"),
    ("EX24", [None], r"exclude: None is not a site name; give names such as 'L0.q'"),
])
def test_EX20_EX24_site_coverage_refuses_quoting_the_name(case, exclude, match):
    with pytest.raises(GateUsageError, match=match):
        site_coverage(SITES, SITES, SITES, exclude=exclude)


@pytest.mark.parametrize("case, infer, match", [
    ("SG01_FF15", "sglang:float64", r"'float64' is not a sglang dtype \(float32, bfloat16, float16\)"),
    ("SG02", "sglang:bf16", r"'bf16' is not a sglang dtype"),
    ("SG04", "sglang:int8", r"'int8' is not a sglang dtype"),
    ("SG05", "sglang:BFLOAT16", r"'BFLOAT16' is not a sglang dtype"),
    ("SG07", "sglang,max_total_tokens=0", r"sglang option max_total_tokens=0 is a size and must be at least 1"),
    ("SG08", "sglang,max_total_tokens=-1", r"sglang option max_total_tokens=-1 is a size and must be at least 1"),
    ("SG09", "sglang,max_total_tokens=1.5", r"sglang option max_total_tokens='1.5' is not a int"),
    ("SG10", "sglang,attention=eager", r"unknown sglang option 'attention'; valid options: max_total_tokens=<int>"),
    ("SG11", "sglang:float32,dtype=bfloat16", r"names the dtype twice \(float32 and dtype=bfloat16\)"),
    ("SG12", "sglang:typical", r"'typical' is not a sglang dtype"),
    ("SG15_FF16", "hf", r"--infer must be minirl\[:PRESET\]\[,knob=value...\], vllm\[:DTYPE\]\[,option=value...\] or "
                   r"sglang\[:DTYPE\]\[,max_total_tokens=N\]; got 'hf' \(hf does not roll out\)"),
    ("SG16", "sglang,max_total_tokens=", r"sglang option max_total_tokens='' is not a int"),
    ("SG17", "sglang,max_total_tokens=10**9", r"sglang option max_total_tokens='10\*\*9' is not a int"),
    ("SG18", "sglang:float32\x00", r"'float32\\x00' is not a sglang dtype"),
])
def test_SG_bad_infer_specs_are_refused_naming_the_token(llama, no_capture, capsys, case, infer, match):
    err = _check(capsys, llama, "--infer", infer)
    assert re.search(match, err), err


def test_SG06_a_float64_dtype_is_refused_by_the_parser(llama, no_capture, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["check", "--model", str(llama), "--infer", "sglang", "--dtype", "float64"])
    assert e.value.code == 2 and "argument --dtype: invalid choice: 'float64'" in capsys.readouterr().err


@pytest.mark.parametrize("case, infer, dtype, options", [
    ("SG03", "sglang:", "bfloat16", {}),  # an empty head is none: the default dtype
    ("SG13", "sglang:float16", "float16", {}),
    ("SG14", "sglang:float32, max_total_tokens=64", "float32", {"max_total_tokens": 64}),  # the space is dropped
])
def test_SG03_SG13_SG14_sound_specs_are_read(case, infer, dtype, options):
    spec = parse_infer(infer, None).spec
    assert (spec.kind, spec.dtype, spec.options) == ("sglang", dtype, options)
