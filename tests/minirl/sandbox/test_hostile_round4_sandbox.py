"""Hostile inputs, round 4 (issue 48), tool sandbox: no file-watch channel out of a call (inotify,
fanotify), no Linux AIO (its events come from a system-wide quota), and a call killed at its
memory limit says so. Each escape is tried with the audit hook disabled, so only the kernel's
seccomp filter can stop it; two sandboxed calls in all (~1 s)."""

from __future__ import annotations

from minirl.sandbox.runner import run_python
from tests.minirl.sandbox.test_sandbox_boundary import SYSCALLS, unhooked

WATCH_AND_AIO = unhooked(SYSCALLS + (
    "ctx = ctypes.c_ulong(0)\n"
    "print(call(253), call(294, 0), call(300, 0, 0),\n"  # inotify_init, inotify_init1, fanotify_init
    "      call(206, 65536, ctypes.byref(ctx)), call(207, 0),\n"  # io_setup, io_destroy
    "      call(208, 0, 0, 1, None, None), call(209, 0, 1, None),\n"  # io_getevents, io_submit
    "      call(210, 0, None, None), call(333, 0, 0, 1, None, None, None))\n"  # io_cancel, io_pgetevents
    "print(ctx.value)"))
"""Raw syscalls, x86_64 numbers (``seccomp.ARCHES``): each must answer EPERM, and io_setup must
leave the context unset (no AIO events reserved)."""


def test_SX07_SX08_SX18_file_watches_and_aio_are_refused() -> None:
    """SX07 (host activity seen through inotify on a read-only bound file), SX08 (a concurrent
    call's opens seen the same way) and SX18 (io_setup took the whole ``fs.aio-max-nr``): with
    ``inotify_init``/``inotify_init1``/``fanotify_init`` refused no watch can be made, so neither
    channel exists; the rest of the AIO calls are refused with io_setup."""
    r = run_python(WATCH_AND_AIO)
    assert r.outcome == "stdout" and r.text.split() == ["EPERM"] * 9 + ["0"], r


def test_SX11_a_call_killed_at_its_memory_limit_says_so() -> None:
    """60 MiB of files in the workdir tmpfs (its pages are the call's memory) of a 64 MiB call: the
    kernel's OOM killer ends the interpreter, and the outcome names the limit, not just SIGKILL."""
    code = ("chunk = b'x' * (1 << 20)\nfor i in range(4):\n    with open(f'f{i}', 'wb') as f:\n"
            "        for _ in range(15):\n            f.write(chunk)\nprint('all written')")
    r = run_python(code, timeout_s=10.0, memory_mb=64)
    assert r.outcome == "error", r
    assert "the call's memory limit (memory_mb=64) was reached" in r.text and "SIGKILL" in r.text, r
