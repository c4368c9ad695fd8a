"""The sandbox is an OS boundary: each escape of issue #26 is tried with the audit hook disabled
first (its tables are reachable from the code, PEP 578), so only the kernel can stop it."""

from __future__ import annotations

import math
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from minirl.sandbox import boundary as sandbox_boundary
from minirl.sandbox import seccomp
from minirl.sandbox.cgroup import CallCgroup, _parents as cgroup_parents
from minirl.sandbox.runner import MAX_PROCESSES, MAX_RESPONSE_CHARS, ToolResult, run_python
from minirl.sandbox.boundary import MODE_ENV, WORKDIR_BYTES, SandboxUnavailable, remove_tree


def unhooked(code: str) -> str:
    """Tool code that empties the audit hook's tables (issue #26's one-liner), then replaces itself
    by a fresh interpreter without any hook running ``code``: only the OS can stop that."""
    return ("import __main__, os, sys\n__main__.BLOCKED_EVENTS.clear(); __main__.BLOCKED_MODULES.clear()\n"
            f"open('unhooked.py', 'w').write({code!r})\n"
            "os.execv(sys.executable, [sys.executable, '-I', '-S', 'unhooked.py'])\n")


def _run_bounded(code: str, limit_s: float = 15.0) -> ToolResult:
    """run_python in a daemon thread, so a parent that hangs fails the test instead of the suite."""
    box: list[ToolResult] = []
    # the code's own budget: its start-up in the sandbox and a 10 MB repr took > 2 s on a 2-core box at load ~4,
    # and a timeout there is not what these tests ask about; the parent's limit stays well above it
    worker = threading.Thread(target=lambda: box.append(run_python(code, timeout_s=8.0)), daemon=True)
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
    """Two layers: the network namespace has only ``lo`` (``/proc/self/net/dev``), and the seccomp
    filter refuses an inet socket before any route is looked up."""
    code = unhooked("import socket\nprint([l.split(':')[0].strip() for l in open('/proc/self/net/dev')][2:])\n"
                    "s = socket.create_connection(('1.1.1.1', 80), timeout=1)")
    r = run_python(code)
    assert r.outcome == "error" and "['lo']" in r.text and "PermissionError: [Errno 1]" in r.text, r


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
def test_result_traps_neither_hang_nor_flood_the_parent(trap: str) -> None:
    """The displayed value comes through a pipe the parent made, not a file the code could have
    replaced by a FIFO (an open would block) or a link to ``/dev/zero`` (endless)."""
    r = _run_bounded(unhooked(f"import os\n{trap}\nprint(6 * 7)"))
    assert (r.outcome, r.text.strip()) == ("stdout", "42"), r
    r = _run_bounded(f"import os\n{trap}\n'x' * 10 ** 7")  # a 10 MB display is cut, not read whole
    assert r.outcome == "no_stdout" and r.text.startswith("'xxx") and len(r.text) <= MAX_RESPONSE_CHARS + 100, r


@pytest.mark.parametrize("mode", ["bwrap", "audit-only"])
def test_temp_dir_is_removed_after_a_timeout_and_a_machinery_failure(mode: str, workdirs: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap's workdir is a tmpfs that dies with the sandbox; audit-only's is on the host."""
    monkeypatch.setenv(MODE_ENV, mode)
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


# The hostile pass's sandbox cases (S05 ... S30): each is tried with the audit hook disabled.

SYSCALLS = ("import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "def call(nr, *args):\n    ctypes.set_errno(0)\n    r = libc.syscall(nr, *args)\n"
            "    return 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]\n")
"""Tool-code prelude: ``call(nr, *args)`` is the raw syscall's ``'ok'`` or its errno's name."""


def test_s05_the_shell_cannot_make_a_user_namespace() -> None:
    code = unhooked("import subprocess\nfor argv in (['unshare', '-Ur', 'id', '-u'], ['unshare', '-Urm', 'true'],"
                    " ['unshare', '-n', 'true']):\n    p = subprocess.run(argv, capture_output=True, text=True)\n"
                    "    print(p.returncode, p.stdout.strip() or p.stderr.strip())")
    r = run_python(code)
    lines = r.text.splitlines()
    assert r.outcome == "stdout" and len(lines) == 3, r
    assert all(line.startswith("1 ") and "Operation not permitted" in line for line in lines), r


def test_s06_namespace_flags_and_mounts_are_refused_while_fork_and_threads_work() -> None:
    """x86_64 numbers: unshare 272, mount 165, setns 308, clone 56 (``CLONE_NEWUSER | SIGCHLD``)."""
    code = unhooked(SYSCALLS + (
        "print(call(272, 0x10000000), call(272, 0x20000), call(272, 0x40000000),\n"
        "      call(165, b'none', b'/sandbox', b'tmpfs', 0, None),\n"
        "      call(308, os.open('/proc/self/ns/net', os.O_RDONLY), 0))\n"
        "pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\nif pid == 0:\n    os._exit(0)\n"
        "print('ok' if pid > 0 else errno.errorcode[ctypes.get_errno()])\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(7)\nprint(os.waitpid(pid, 0)[1] >> 8)\n"
        "import threading\nt = threading.Thread(target=print, args=('thread',))\nt.start(); t.join()\n"))
    r = run_python(code)
    assert r.outcome == "stdout" and r.text.split() == ["EPERM"] * 6 + ["7", "thread"], r


def test_s21_io_uring_bpf_perf_userfaultfd_ptrace_are_refused_and_clone3_falls_back() -> None:
    """io_uring_setup 425 / enter 426 / register 427, bpf 321, perf_event_open 298, userfaultfd
    323, ptrace 101 (PTRACE_TRACEME), clone3 435; the filter shows in ``/proc/self/status``."""
    code = unhooked(SYSCALLS + (
        "params = ctypes.create_string_buffer(120)\n"
        "print(call(425, 8, params), call(426, 0, 1, 0, 0, None, 0), call(427, 0, 0, None, 0), call(321, 0, None, 0),\n"
        "      call(298, params, 0, -1, -1, 0), call(323, 0), call(101, 0, 0, None, None), call(435, None, 0))\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')][0])"))
    r = run_python(code)
    assert r.outcome == "stdout" and r.text.split() == ["EPERM"] * 7 + ["ENOSYS", "2"], r


def test_s30_only_unix_sockets_vsock_and_netlink_are_refused() -> None:
    """vsock is not namespaced (the sandbox shared the host's port space): no socket of a family
    but ``AF_UNIX`` can be made at all. The host's own vsock is never touched."""
    code = unhooked(
        "import socket\nfor family, kind in ((40, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_STREAM),\n"
        "        (socket.AF_INET6, socket.SOCK_DGRAM), (16, socket.SOCK_RAW), (17, socket.SOCK_RAW)):\n"
        "    try:\n        socket.socket(family, kind)\n        print('made', family)\n"
        "    except OSError as e:\n        print(e.errno)\n"
        "a, b = socket.socketpair()\na.sendall(b'unix')\nprint(b.recv(4).decode())")
    r = run_python(code)
    assert r.outcome == "stdout" and r.text.split() == ["1"] * 5 + ["unix"], r  # 1 = EPERM


def test_s12_no_kernel_keyring_carries_anything_between_calls() -> None:
    """add_key 248, request_key 249, keyctl 250 (KEYCTL_GET_KEYRING_ID of @u = -4)."""
    leave = unhooked(SYSCALLS + "print(call(248, b'user', b'minirl-s12', b'answer=42', 9, -4))")
    read = unhooked(SYSCALLS + "print(call(249, b'user', b'minirl-s12', None, -4), call(250, 0, -4, 0))")
    first, second = run_python(leave), run_python(read)
    assert (first.outcome, first.text.split()) == ("stdout", ["EPERM"]), first
    assert (second.outcome, second.text.split()) == ("stdout", ["EPERM", "EPERM"]), second


def test_s14_the_workdir_is_a_capped_tmpfs() -> None:
    code = ("import errno\nwritten, err, chunk = 0, None, b'x' * (1 << 20)\nfor i in range(200):\n    try:\n"
            "        with open(f'f{i}', 'wb') as f:\n            for _ in range(8):\n"
            "                f.write(chunk)\n                written += 1\n"
            "    except OSError as e:\n        err = errno.errorcode[e.errno]\n        break\nprint(written, err)")
    r = run_python(code, timeout_s=20.0)
    written, err = r.text.split()
    assert r.outcome == "stdout" and err == "ENOSPC" and int(written) <= WORKDIR_BYTES >> 20, r


def test_s16_memory_is_bounded_per_call_not_per_process() -> None:
    """4 children of a 128 MiB call each hold 48 MiB: at most 2 can be alive together."""
    code = unhooked(
        "import os, time\npids = []\nfor _ in range(4):\n    r, w = os.pipe()\n    pid = os.fork()\n"
        "    if pid == 0:\n        data = b'x' * (48 << 20)\n        os.write(w, b'1')\n        time.sleep(30)\n"
        "        os._exit(0)\n    os.close(w)\n    os.read(r, 1)\n    pids.append(pid)\ntime.sleep(0.3)\n"
        "print(sum(os.waitpid(p, os.WNOHANG) == (0, 0) for p in pids))")
    r = run_python(code, timeout_s=20.0, memory_mb=128)
    assert r.outcome == "stdout" and 1 <= int(r.text) <= 2, r


def test_s22_s22b_after_a_timeout_nothing_of_the_call_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three concurrent calls, each with 20 children churning files, time out; when the parent's
    kill returns, the call's cgroup is empty and stays empty (listed twice, 30 ms apart), every
    call says "timeout" (never "error": nothing is left to clean up on the host), and the cgroups
    are gone."""
    seen: list[tuple[list[int], list[int]]] = []
    kill = CallCgroup.kill

    def spy(self: CallCgroup) -> None:
        kill(self)
        first = self.pids()
        time.sleep(0.03)
        seen.append((first, self.pids()))
    monkeypatch.setattr(CallCgroup, "kill", spy)
    code = unhooked(
        "import os, time\nfor i in range(20):\n    if os.fork() == 0:\n        n = 0\n        while True:\n"
        "            n += 1\n            d = f'd{os.getpid()}_{n}'\n            try:\n                os.mkdir(d)\n"
        "                os.symlink('/etc', d + 'l')\n                os.rename(d, d + 'r')\n"
        "            except OSError:\n                pass\ntime.sleep(30)")
    results: list[ToolResult] = []
    workers = [threading.Thread(target=lambda: results.append(run_python(code, timeout_s=1.5))) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [r.outcome for r in results] == ["timeout"] * 3, results
    assert seen == [([], [])] * 3
    assert _call_cgroups() == []


def test_s22c_cleanup_never_changes_a_file_through_a_link(tmp_path: Path) -> None:
    """audit-only's temp dir is on the host: while a name flips between a locked directory and a
    link to an outside directory, giving access back never reaches the outside one."""
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(outside, 0o750)
    top = tmp_path / "work"
    top.mkdir()
    (top / "link-at-top").symlink_to(outside)
    with pytest.raises(OSError):
        sandbox_boundary._give_owner_access(str(top / "link-at-top"))
    flipping = threading.Event()

    def flip() -> None:
        while not flipping.is_set():
            os.mkdir(top / "aside", 0)
            os.rename(top / "aside", top / "victim")
            os.rmdir(top / "victim")
            os.symlink(outside, top / "victim")
            os.unlink(top / "victim")
    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(300):
            sandbox_boundary._give_owner_access(str(top))
    finally:
        flipping.set()
        flipper.join()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o750


def test_s24_a_call_holding_processes_does_not_starve_another() -> None:
    """Each call has its own uid and its own pids cgroup: call A holds as many processes as it
    can, call B, started meanwhile, still forks all of its 10."""
    hold = unhooked("import os, time\nborn = 0\nwhile born < 256:\n    try:\n        if os.fork() == 0:\n"
                    "            time.sleep(60)\n            os._exit(0)\n    except OSError:\n        break\n"
                    "    born += 1\nprint(born, flush=True)\ntime.sleep(60)")
    fork10 = unhooked("import os, time\nborn = 0\nfor _ in range(10):\n    try:\n        if os.fork() == 0:\n"
                      "            time.sleep(60)\n            os._exit(0)\n    except OSError:\n        continue\n"
                      "    born += 1\nprint(born)")  # all 10 alive together
    box: list[ToolResult] = []
    holder = threading.Thread(target=lambda: box.append(run_python(hold, timeout_s=4.0)))
    holder.start()
    held = _wait_for_a_call_holding(MAX_PROCESSES - 8, within_s=3.5)
    second = run_python(fork10)
    holder.join(30)
    assert held, "call A never held its processes: B did not run beside it"
    assert (second.outcome, second.text.strip()) == ("stdout", "10"), second
    assert box[0].outcome == "timeout" and int(box[0].text.split()[-1]) >= MAX_PROCESSES - 8, box


def _wait_for_a_call_holding(count: int, within_s: float) -> bool:
    """Whether a call of this process had ``count`` processes in its cgroup within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for directory in _call_cgroups():
            try:
                if len((directory / "cgroup.procs").read_text().split()) >= count:
                    return True
            except FileNotFoundError:  # that call just ended
                pass
        time.sleep(0.05)
    return False


def _call_cgroups() -> list[Path]:
    """The cgroups of this process's running calls, in every hierarchy."""
    return [Path(parent, name) for parent, _ in cgroup_parents() for name in os.listdir(parent)
            if name.startswith(f"minirl-sandbox-{os.getpid()}-")]


def test_s25_no_pseudo_terminals() -> None:
    code = unhooked("import os\nmade, errs = 0, set()\nfor _ in range(50):\n    try:\n        os.openpty()\n"
                    "        made += 1\n    except OSError as e:\n        errs.add(e.errno)\nprint(made, sorted(errs))")
    r = run_python(code)
    assert r.outcome == "stdout" and r.text.split()[0] == "0", r


@pytest.mark.parametrize("machine, header", [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"), ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_seccomp_tables_match_the_kernel_headers(machine: str, header: str) -> None:
    """The aarch64 table cannot be run here; it is checked against linux-libc-dev's header."""
    if not os.path.exists(header):
        pytest.skip(f"{header} not installed (Debian: linux-libc-dev)")
    text = Path(header).read_text()
    for name, nr in seccomp.ARCHES[machine][1].items():
        assert re.search(rf"^#define __NR(?:3264)?_{name}\s+{nr}\b", text, re.M), (machine, name, nr)
    assert len(seccomp.program(machine)) % 8 == 0
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.program("riscv64")
