"""Hostile inputs, round 5 (issue 65), the tcmalloc relaunch (``labs.allocator``): it is invisible.
Only the project's own entry points re-execute (``mlab``, ``python -m labs.cli`` / ``labs.reproduce``);
a script, ``python -c`` or stdin calling ``labs.cli.main()`` runs once, on the allocator it started
with (docs/rl.md "The allocator"). Named by the round-5 case id (AL).

The children find "tcmalloc" where ``FAKE_SEARCH`` says (a ``sitecustomize`` on their PYTHONPATH
points ``allocator.SEARCH`` there), so a relaunch happens, or would, whether or not this machine has
the library; at exit the process that ran last prints what it ran under. The command is ``mlab zoo
--help``, which imports no torch (a tenth of a second)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labs import allocator

REPO = Path(__file__).resolve().parents[2]
SITECUSTOMIZE = """\
import atexit, json, os, sys
if os.environ.get("FAKE_SEARCH"):
    from labs import allocator
    allocator.SEARCH = (os.environ["FAKE_SEARCH"],)
    atexit.register(lambda: print("RAN " + json.dumps({k: os.environ.get(k) for k in
                                  ("LD_PRELOAD", allocator.RELAUNCHED)}), flush=True))
"""
HELP = "import sys; import labs.cli; sys.argv = ['mlab', 'zoo', '--help']; labs.cli.main()\n"


@pytest.fixture()
def fake(tmp_path: Path) -> dict[str, str]:
    """A clean environment whose children see a (garbage) ``LIBRARY`` in a folder of ``tmp_path``:
    the loader ignores it with a warning, which is AL05's corrupt library too."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / allocator.LIBRARY).write_bytes(b"not an ELF file")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.RELAUNCHED, "MLAB_MALLOC")}
    return {**env, "PYTHONPATH": f"{tmp_path / 'site'}:{REPO}", "FAKE_SEARCH": str(tmp_path / "lib")}


def _run(args: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run a child Python; (the result, what the last process ran under: LD_PRELOAD, the relaunch marker)."""
    done = subprocess.run([sys.executable, *args], env=env, input=stdin, capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    ran = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("RAN ")]
    assert done.returncode == 0 and len(ran) == 1, (done.stdout, done.stderr)  # one process exited, rc 0
    return done, ran[0]


def test_AL01_the_mlab_entry_point_relaunches_on_tcmalloc(fake):
    done, ran = _run(["-m", "labs.cli", "zoo", "--help"], fake)
    assert ran == {"LD_PRELOAD": f"{fake['FAKE_SEARCH']}/{allocator.LIBRARY}", allocator.RELAUNCHED: "1"}
    assert "usage: mlab zoo" in done.stdout


def test_AL01_the_console_script_is_an_entry_point_and_a_namesake_is_not(tmp_path, monkeypatch):
    import sysconfig

    main = type(sys)("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    main.__spec__, main.__file__ = None, str(Path(sysconfig.get_path("scripts")) / "mlab")
    assert allocator.entry_point()
    main.__file__ = str(tmp_path / "mlab")  # the user's own file called mlab
    assert not allocator.entry_point()


def test_AL02_system_keeps_glibc(fake):
    _, ran = _run(["-m", "labs.cli", "zoo", "--help"], {**fake, "MLAB_MALLOC": "system"})
    assert ran == {"LD_PRELOAD": None, allocator.RELAUNCHED: None}


def test_AL03_an_unknown_opt_out_is_warned_once(fake):
    done, ran = _run(["-m", "labs.cli", "zoo", "--help"], {**fake, "MLAB_MALLOC": "glibc"})
    assert done.stderr.count("MLAB_MALLOC='glibc' is not understood (only 'system'") == 1
    assert ran[allocator.RELAUNCHED] == "1"  # warned, not obeyed


@pytest.mark.parametrize("case", ["AL04_absent", "AL11_dangling_link"])
def test_AL04_AL11_no_library_keeps_glibc_without_error(case, tmp_path, monkeypatch):
    if case == "AL11_dangling_link":
        (tmp_path / allocator.LIBRARY).symlink_to(tmp_path / "gone.so")
    monkeypatch.setattr(allocator, "SEARCH", (str(tmp_path),))
    assert allocator.library() is None and allocator.preload_env({}) == {}


def test_AL05_a_corrupt_library_runs_without_a_relaunch_loop(fake):
    done, ran = _run(["-m", "labs.cli", "zoo", "--help"], fake)
    assert ran[allocator.RELAUNCHED] == "1" and "usage: mlab zoo" in done.stdout
    assert allocator.LIBRARY in done.stderr  # the loader's own warning, once
    assert done.stderr.count(allocator.LIBRARY) == 1


def test_AL06_a_missing_user_preload_runs_without_a_loop(fake):
    done, ran = _run(["-m", "labs.cli", "zoo", "--help"], {**fake, "LD_PRELOAD": "/nonexistent/libuser.so"})
    assert ran["LD_PRELOAD"].endswith(":/nonexistent/libuser.so") and "usage: mlab zoo" in done.stdout


def test_AL07_a_script_on_stdin_runs(fake):
    """Re-executing ``python -`` would read a spent stdin: the command would silently not run."""
    done, ran = _run(["-"], fake, stdin=HELP)
    assert "usage: mlab zoo" in done.stdout and ran == {"LD_PRELOAD": None, allocator.RELAUNCHED: None}


def test_AL08_python_c_runs(fake):
    done, ran = _run(["-c", HELP], fake)
    assert "usage: mlab zoo" in done.stdout and ran[allocator.RELAUNCHED] is None


def test_AL09_a_drivers_side_effects_happen_once(fake, tmp_path):
    script, appended = tmp_path / "driver.py", tmp_path / "appended.txt"
    script.write_text(f"open({str(appended)!r}, 'a').write('once\\n')\n{HELP}")
    done, _ = _run([str(script)], fake)
    assert appended.read_text() == "once\n" and "usage: mlab zoo" in done.stdout


def test_AL10_a_preset_marker_keeps_glibc(fake):
    _, ran = _run(["-m", "labs.cli", "zoo", "--help"], {**fake, allocator.RELAUNCHED: "1"})
    assert ran == {"LD_PRELOAD": None, allocator.RELAUNCHED: "1"}
