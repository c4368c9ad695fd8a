"""The sandbox is an OS boundary: each escape of issue #26 is tried with the audit hook disabled
first (its tables are reachable from the code, PEP 578), so only the kernel can stop it."""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from minirl.sandbox import boundary as sandbox_boundary
from minirl.sandbox.runner import MAX_PROCESSES, ToolResult, run_python
from minirl.sandbox.boundary import MODE_ENV, SandboxUnavailable, read_result_file, remove_tree


def unhooked(code: str) -> str:
    """Tool code that empties the audit hook's tables (issue #26's one-liner), then replaces itself
    by a fresh interpreter without any hook running ``code``: only the OS can stop that."""
    return ("import __main__, os, sys\n__main__.BLOCKED_EVENTS.clear(); __main__.BLOCKED_MODULES.clear()\n"
            f"open('unhooked.py', 'w').write({code!r})\n"
            "os.execv(sys.executable, [sys.executable, '-I', '-S', 'unhooked.py'])\n")


def _run_bounded(code: str, limit_s: float = 15.0) -> ToolResult:
    """run_python in a daemon thread, so a parent that hangs fails the test instead of the suite."""
    box: list[ToolResult] = []
    worker = threading.Thread(target=lambda: box.append(run_python(code, timeout_s=2.0)), daemon=True)
    worker.start()
    worker.join(limit_s)
    assert not worker.is_alive(), f"the parent hung for {limit_s} s on: {code!r}"
    return box[0]


def _proc_cmdlines() -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            pass
    return out


@pytest.fixture
def workdirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the sandbox's temp dirs are made during the test, to check that none is left."""
    root = tmp_path / "workdirs"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_disabled_hook_runs_a_shell_that_writes_nothing_outside(tmp_path: Path) -> None:
    r = run_python("import __main__, os; __main__.BLOCKED_EVENTS.clear(); __main__.BLOCKED_MODULES.clear()\n"
                   f"print(os.system('id -u > {tmp_path}/x') != 0, os.system('true'))")
    assert (r.outcome, r.text.split()) == ("stdout", ["True", "0"]), r  # the hook is off: a shell ran
    assert not (tmp_path / "x").exists()


def test_outside_files_cannot_be_linked_nor_removed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    for code in (f"import os\nos.link({str(victim)!r}, 'v')\nopen('v', 'w').write('PWNED')",
                 f"import os\nos.remove('victim.txt', dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY))"):
        r = run_python(unhooked(code))
        assert r.outcome == "error" and "FileNotFoundError" in r.text, r
    assert victim.read_text() == "original"


def test_no_process_environment_reveals_a_secret() -> None:
    """``/proc/<pid>/environ`` shows a process's environment as it was at exec, so the secret sits
    in a process started with it (a stand-in trainer), and the code scans every pid it can see."""
    secret = f"minirl-secret-{os.getpid()}-{time.time_ns()}"
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env={**os.environ, "MINIRL_TEST_SECRET": secret})
    try:
        code = unhooked(
            f"import os\npids = [p for p in os.listdir('/proc') if p.isdigit()] + ['{trainer.pid}', '{os.getpid()}']\n"
            "def environ(pid):\n    try:\n        return open(f'/proc/{pid}/environ', 'rb').read()\n"
            "    except OSError:\n        return b''\n"
            f"print(b'PATH=' in environ('self'), any({secret.encode()!r} in environ(p) for p in pids), "
            "'MINIRL_TEST_SECRET' in os.environ)")
        r = run_python(code)
    finally:
        trainer.kill()
        trainer.wait()
    assert (r.outcome, r.text.split()) == ("stdout", ["True", "False", "False"]), r


def test_code_never_runs_as_root() -> None:
    """The uid the kernel checks (the inside uid mapped through uid_map) is not 0."""
    code = unhooked(
        "import os\nuid = os.getuid()\nfor line in open('/proc/self/uid_map'):\n"
        "    inside, outside, count = map(int, line.split())\n"
        "    if inside <= uid < inside + count:\n        print(outside + uid - inside)")
    r = run_python(code)
    assert r.outcome == "stdout" and int(r.text) != 0, r


def test_no_privileges_and_a_read_only_private_view() -> None:
    repo = str(Path(__file__).resolve().parents[3])
    code = unhooked(
        "import os\nstatus = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(int(status['CapEff'], 16), int(status['CapPrm'], 16), status['NoNewPrivs'].strip())\n"
        "for path in ('/x', '/usr/x', '/etc/x', '/proc/sys/kernel/hostname'):\n    try:\n"
        "        open(path, 'w').write('x')\n        print('wrote', path)\n    except OSError as e:\n"
        "        print(type(e).__name__)\n"
        f"print(os.path.exists({repo!r}), os.path.exists('/home'), os.path.exists('/sys'))")
    r = run_python(code)
    lines = r.text.splitlines()
    assert r.outcome == "stdout" and lines[0] == "0 0 1", r  # no capabilities, no_new_privs
    assert not any(line.startswith("wrote") for line in lines), r
    assert lines[-1] == "False False False", r


def test_only_loopback_with_the_hook_disabled() -> None:
    code = unhooked("import socket\nprint([name for _, name in socket.if_nameindex()])\n"
                    "s = socket.create_connection(('1.1.1.1', 80), timeout=1)")
    r = run_python(code)
    assert r.outcome == "error" and "['lo']" in r.text and "OSError" in r.text, r


def test_fork_bomb_stops_at_the_process_limit() -> None:
    code = unhooked("import os, time\nborn = 0\nwhile born < 256:\n"
                    "    try:\n        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
                    "    except OSError:\n        break\n    born += 1\nprint(born)")
    r = run_python(code, timeout_s=10.0)
    assert r.outcome == "stdout" and int(r.text) < MAX_PROCESSES, r
    assert not any("unhooked.py" in cmdline for cmdline in _proc_cmdlines())  # the sleepers died with the call


def test_children_do_not_outlive_the_call() -> None:
    marker = "minirl_sandbox_child_marker_4711"
    for code in (f"import subprocess\nsubprocess.Popen(['sleep', '30', '{marker}'])",
                 "import os\nwhile True:\n    os.fork()",
                 f"import os\nos.system('sleep 30 {marker}')",
                 "import multiprocessing\nmultiprocessing.Process(target=print).start()",
                 "import ctypes\nctypes.CDLL(None).fork()"):
        r = run_python(code, timeout_s=2.0)
        assert r.outcome == "error", (code, r)
    assert not any(marker in c for c in _proc_cmdlines())


@pytest.mark.parametrize("trap", ["os.mkfifo('.display')", "os.symlink('/dev/zero', '.display')"])
def test_result_file_traps_neither_hang_nor_flood_the_parent(trap: str, workdirs: Path) -> None:
    t0 = time.monotonic()
    r = _run_bounded(unhooked("import os\n" + trap))
    assert r.outcome == "error" and "not read" in r.text and time.monotonic() - t0 < 10, r
    assert list(workdirs.iterdir()) == []


def test_temp_dir_is_removed_after_a_timeout_and_a_machinery_failure(workdirs: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_python("while True:\n    pass", timeout_s=1.0).outcome == "timeout"
    assert list(workdirs.iterdir()) == []

    def no_popen(*args, **kwargs):
        raise OSError("fork failed")
    monkeypatch.setattr("subprocess.Popen", no_popen)
    r = run_python("print(1)")
    assert r.outcome == "error" and "fork failed" in r.text
    assert list(workdirs.iterdir()) == []


def test_unknown_mode_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODE_ENV, "off")
    with pytest.raises(ValueError, match=f"{MODE_ENV}='off'.*audit-only"):
        run_python("print(1)")


@pytest.mark.parametrize("fake_bwrap, reason", [
    (None, "bwrap.* not found on PATH"),  # not installed
    ("echo 'bwrap: No permissions to create new namespace' >&2; exit 1", "exit 1: bwrap: No permissions"),  # refused
])
def test_refused_unless_the_weak_mode_is_named(fake_bwrap: str | None, reason: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    if fake_bwrap is not None:
        (tmp_path / "bwrap").write_text(f"#!/bin/sh\n{fake_bwrap}\n")
        (tmp_path / "bwrap").chmod(0o755)
        (tmp_path / "setpriv").symlink_to("/usr/bin/setpriv")
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox_boundary._probe.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match=f"{reason}.*{MODE_ENV}=audit-only"):
            run_python("print(1)")
        monkeypatch.setenv(MODE_ENV, "audit-only")
        r = run_python("print(6 * 7)")
        assert (r.outcome, r.text.strip()) == ("stdout", "42")
    finally:
        sandbox_boundary._probe.cache_clear()


@pytest.mark.parametrize("kwargs, name", [
    ({"timeout_s": math.inf}, "timeout_s=inf"), ({"timeout_s": "5"}, "timeout_s='5'"),
    ({"timeout_s": math.nan}, "timeout_s=nan"), ({"memory_mb": math.nan}, "memory_mb=nan"),
    ({"timeout_s": 0}, "timeout_s=0"), ({"memory_mb": 32}, "memory_mb=32"), ({"memory_mb": True}, "memory_mb=True"),
])
def test_limits_name_the_argument_and_the_range(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=rf"{name}: must be .* in [\[(]"):
        run_python("print(1)", **kwargs)


def test_result_file_read_is_capped_and_refuses_links(tmp_path: Path) -> None:
    path = tmp_path / "r"
    path.write_text("x" * 100)
    text, _ = read_result_file(str(path), 10)
    assert text.startswith("x" * 10) and "x" * 11 not in text and "cut" in text
    assert read_result_file(str(tmp_path / "absent"), 10) == ("", "")
    (tmp_path / "link").symlink_to(path)
    assert read_result_file(str(tmp_path / "link"), 10)[0] is None


def test_remove_tree_restores_access_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o750)
    os.chmod(outside, 0o750)
    top = tmp_path / "work"
    (top / "locked" / "deeper").mkdir(parents=True)
    (top / "locked" / "escape").symlink_to(outside)
    os.chmod(top / "locked" / "deeper", 0)
    os.chmod(top / "locked", 0)
    sandbox_boundary._give_owner_access(str(top))
    assert stat.S_IMODE(os.stat(top / "locked").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(top / "locked" / "deeper").st_mode) == 0o700
    assert stat.S_IMODE(outside.stat().st_mode) == 0o750
    remove_tree(str(top))
    assert not top.exists() and outside.is_dir()
