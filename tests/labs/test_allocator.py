"""labs.allocator: the tcmalloc preload ``mlab``, ``labs.reproduce`` and the Makefile start under."""

import os
import subprocess
import sys

import pytest

from labs import allocator

needs_tcmalloc = pytest.mark.skipif(allocator.library() is None,
                                    reason="libtcmalloc-minimal4 not installed (make debs installs it as root)")
PROBE = ("from labs import allocator; allocator.entry_point = lambda: True; allocator.relaunch(); import sys; "
         "print(allocator.active(), sys.argv[1:])")
"""Stands in for ``mlab`` (an entry point that ``relaunch`` re-executes; a plain ``-c`` is not one)."""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the preload the Makefile may have started pytest under."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.RELAUNCHED, "MLAB_MALLOC")}
    return {**env, **extra}


def probe(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", PROBE, "a", "--b"], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


@needs_tcmalloc
def test_relaunch_puts_the_process_on_tcmalloc_with_its_arguments():
    assert probe(clean_env()) == "True ['a', '--b']"


@needs_tcmalloc
def test_system_opt_out_keeps_glibc():
    assert probe(clean_env(MLAB_MALLOC="system")) == "False ['a', '--b']"


@needs_tcmalloc
def test_a_failed_preload_does_not_loop():
    # the marker says this process was already re-executed: it must not exec again, preloaded or not
    assert probe(clean_env(**{allocator.RELAUNCHED: "1"})) == "False ['a', '--b']"


@needs_tcmalloc
def test_preload_env_keeps_the_users_preload_and_adds_it_once():
    lib = str(allocator.library())
    assert allocator.preload_env({"LD_PRELOAD": "/x/libfoo.so"})["LD_PRELOAD"] == f"{lib}:/x/libfoo.so"
    assert allocator.preload_env({"LD_PRELOAD": lib}) == {}
    assert allocator.preload_env({"MLAB_MALLOC": "system"}) == {}
    assert allocator.preload_env({})["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] == str(1 << 40)


def test_no_library_means_no_preload(monkeypatch):
    monkeypatch.setattr(allocator, "SEARCH", ("/nonexistent",))
    assert allocator.library() is None
    assert allocator.preload_env({}) == {}


@needs_tcmalloc
def test_makefile_variables_line_starts_a_process_on_tcmalloc():
    line = subprocess.run([sys.executable, "-m", "labs.allocator"], env=clean_env(), capture_output=True, text=True,
                          check=True, timeout=60).stdout.split()
    env = clean_env(**dict(item.split("=", 1) for item in line))
    out = subprocess.run([sys.executable, "-c", "from labs import allocator; print(allocator.active())"], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert out == "True"
