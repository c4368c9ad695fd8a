"""Sandboxed Python for tool calls: ``run_python(code) -> ToolResult``.

rStar2-Agent §2.2.2 has the environment answer a tool call with one of four outcomes:
``"stdout"`` (the program printed), ``"no_stdout"`` (it printed nothing; the text is the last
expression's value as IPython would show it, or ``(no output)``), ``"error"`` (message and
traceback) and ``"timeout"``. ``.text`` is what the model sees inside ``<tool_response>``, cut to
``MAX_RESPONSE_CHARS`` (head and tail kept, a marker in between).

Why these layers (model-written code is hostile until proven otherwise, rStar2-Agent §3):

* the OS boundary of ``minirl.sandbox.boundary`` (bubblewrap: own mount/PID/network namespaces,
  read-only system, only a size-capped tmpfs writable, a uid of its own, ``no_new_privs``, a
  seccomp filter, a cgroup bounding the call's memory and processes); where it cannot run, tool
  code is refused unless ``MLAB_SANDBOX=audit-only`` opts into the weaker mode;
* a fresh ``python -I -S -u`` in its own temp dir with a minimal environment: stdlib only;
* rlimits set before the code runs, hard = soft: address space and data = ``memory_mb`` (so one
  huge allocation is a ``MemoryError``, not an OOM kill), CPU seconds, file size
  ``MAX_FILE_BYTES``, open files, processes ``MAX_PROCESSES``;
* a ``sys.addaudithook`` hook refusing sockets, process creation, signals, rlimit changes and
  writes outside the temp dir. It is a second layer only (its tables are reachable from the code
  it guards, PEP 578): it turns the common mistakes into clear messages, the kernel does the rest.

The parent reads at most ``CAPTURE_BYTES`` per stream (the rest is drained and counted), so an
output flood costs neither memory nor a blocked child. It reads nothing before every process of
the call is gone, and no file the code could have touched: the code comes in on stdin, the
displayed value goes out through a pipe.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from minirl.sandbox.boundary import Call, check_sandbox, memfd, python_executable

OUTCOMES = ("stdout", "no_stdout", "error", "timeout")
MAX_RESPONSE_CHARS = 2048  # what the model sees; rStar2-Agent gives no number, 2 KiB ~ 600 tokens
CAPTURE_BYTES = 64 * 1024  # per stream kept by the parent before truncation
MAX_FILE_BYTES = 16 * 1024 * 1024  # RLIMIT_FSIZE: largest file the code may write in its temp dir
MAX_PROCESSES = 64  # RLIMIT_NPROC of the sandbox uid: a fork bomb stops here
MAX_TIMEOUT_S = 3600.0  # one tool call; longer is a stuck rollout, not a computation
MEMORY_MB_RANGE = (64, 1 << 20)  # the interpreter itself needs ~40 MiB; 1 TiB is past any machine


@dataclass(frozen=True)
class ToolResult:
    outcome: str  # one of OUTCOMES
    text: str  # the <tool_response> body, at most MAX_RESPONSE_CHARS (+ marker)
    elapsed_s: float = 0.0

    @property
    def is_error(self) -> bool:
        """rStar2-Agent Eq. 4 counts errors and timeouts as failed tool calls."""
        return self.outcome in ("error", "timeout")


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 256) -> ToolResult:
    """Run ``code`` in the sandbox; never raises for anything the code does (a failure of the
    sandbox itself is an ``"error"`` outcome, so one bad trajectory does not stop a run). Raises
    ``SandboxUnavailable`` when this machine cannot sandbox at all (every call would fail)."""
    if not isinstance(code, str):
        raise TypeError(f"code must be str, got {type(code).__name__}")
    check_limits(timeout_s, memory_mb)
    check_sandbox()
    start = time.monotonic()
    try:
        outcome, text = _run(code, timeout_s, memory_mb)
    except Exception as e:  # the machinery failed (e.g. no temp space): the trajectory sees it
        outcome, text = "error", f"SandboxError: {type(e).__name__}: {e}"
    return ToolResult(outcome, truncate(text), time.monotonic() - start)


def check_limits(timeout_s: float, memory_mb: int) -> None:
    """Refuse limits that would disable themselves (``inf``/``nan`` compare false everywhere)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s={timeout_s!r}: must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]; "
                         f"e.g. timeout_s=5.0")
    low, high = MEMORY_MB_RANGE
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or not low <= memory_mb <= high:
        raise ValueError(f"memory_mb={memory_mb!r}: must be an integer number of MiB in [{low}, {high}] "
                         f"(the interpreter itself needs ~40 MiB); e.g. memory_mb=256")


def truncate(text: str, limit: int = MAX_RESPONSE_CHARS) -> str:
    """Keep the first 3/4 and the last 1/4 of ``limit`` chars: a traceback's end is its point."""
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 4
    return f"{text[:head]}\n... [truncated {len(text) - head - tail} characters] ...\n{text[-tail:]}"


def _run(code: str, timeout_s: float, memory_mb: int) -> tuple[str, str]:
    """The code comes in on stdin (a memfd) and the displayed value goes out through a pipe: the
    parent opens no file the code could have swapped for a FIFO or a link."""
    call = Call(memory_mb << 20, MAX_PROCESSES)
    try:
        source = memfd("tool-code", code.encode())
        display_r, display_w = os.pipe()
        cpu_s = math.ceil(timeout_s) + 1  # backstop only: the wall clock below decides
        limits = (memory_mb << 20, cpu_s, MAX_FILE_BYTES, MAX_PROCESSES)
        cmd = call.command([python_executable(), "-I", "-S", "-u", "-c", _BOOT, call.workdir, str(display_w),
                            *map(str, limits)])
        env = {"PATH": "/usr/bin:/bin", "HOME": call.workdir, "TMPDIR": call.workdir, "LC_ALL": "C.UTF-8"}
        try:
            proc = subprocess.Popen(cmd, cwd=call.cwd, env=env, stdin=source, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=(display_w, *call.fds), start_new_session=True)
        except BaseException:
            os.close(display_r)
            raise
        finally:
            os.close(source)
            os.close(display_w)
        out, err, shown = _Capped(proc.stdout), _Capped(proc.stderr), _Capped(open(display_r, "rb"))
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
            oom_kills = call.oom_kills()  # before close() removes the cgroup that counts them
            call.close()  # every process of the call is gone: the pipes end, nothing writes any more
        out.join(), err.join(), shown.join()
        stdout, stderr = out.text(), err.text()
        if timed_out:
            return "timeout", f"TimeoutError: execution exceeded {timeout_s:g} s" + (
                f"\nPartial stdout:\n{stdout}" if stdout else "")
        if proc.returncode != 0:
            died = f"Process killed by signal {name}\n" if (name := _signal_name(proc.returncode)) else ""
            if oom_kills:
                died = (f"MemoryError: the call's memory limit (memory_mb={memory_mb}) was reached; the kernel "
                        f"killed {oom_kills} of its processes\n{died}")
            return "error", (stdout + ("\n" if stdout else "") + died + stderr).rstrip()
        if stdout:
            return "stdout", stdout
        return "no_stdout", shown.text() or "(no output)"
    finally:
        call.close()



def _signal_name(returncode: int) -> str:
    """The signal that ended the code: Popen says -N, bwrap passes a child's death on as 128 + N."""
    signum = -returncode if returncode < 0 else returncode - 128
    try:
        return signal.Signals(signum).name
    except ValueError:
        return ""


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run's session (the child is its leader), then reap it. Under bwrap the call's
    cgroup is emptied after this (``Call.close``); audit-only has only the session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


class _Capped(threading.Thread):
    """Drain a pipe, keeping the first CAPTURE_BYTES and counting the rest."""

    def __init__(self, pipe) -> None:
        super().__init__(daemon=True)
        self.pipe, self.kept, self.dropped = pipe, bytearray(), 0
        self.start()

    def run(self) -> None:
        while chunk := self.pipe.read1(65536):
            room = CAPTURE_BYTES - len(self.kept)
            self.kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)
        self.pipe.close()

    def text(self) -> str:
        s = self.kept.decode("utf-8", errors="replace")
        return s + (f"\n... [{self.dropped} more bytes not captured]" if self.dropped else "")


# Runs in the child as ``python -c``, the code on stdin: argv = workdir, display fd, AS bytes, CPU s, FSIZE, NPROC.
_BOOT = r'''
import ast, linecache, os, resource, sys, traceback
tmp, display_fd = os.path.realpath(sys.argv[1]), int(sys.argv[2])
mem, cpu, fsize, nproc = (int(a) for a in sys.argv[3:7])
for lim, v in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_DATA, mem), (resource.RLIMIT_CPU, cpu),
               (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0),
               (resource.RLIMIT_NPROC, nproc)):
    resource.setrlimit(lim, (v, v))
src = sys.stdin.buffer.read().decode()
BLOCKED_MODULES = {"ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi",
                   "_xxsubinterpreters", "_xxinterpchannels"}
BLOCKED_EVENTS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                  "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "resource.setrlimit",
                  "resource.prlimit", "os.setuid", "os.setgid", "os.chroot", "os.unshare"}
PATH_ARGS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
             "os.link": (1,), "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,),
             "os.chown": (0,), "os.utime": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
             "os.mkfifo": (0,), "os.mknod": (0,)}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
def inside(p):
    if isinstance(p, int):
        return True  # an fd: already open (stdio, or passed the check when opened)
    p = os.path.realpath(os.fsdecode(p))
    return p == tmp or p.startswith(tmp + os.sep) or p == "/dev/null"
def hook(event, args):
    if event == "import" and args[0].split(".")[0] in BLOCKED_MODULES:
        raise ImportError("sandbox: module " + args[0] + " is not available")
    if event in BLOCKED_EVENTS or event.startswith("socket."):
        raise PermissionError("sandbox: " + event + " is not allowed (no network, no processes)")
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS
        if writes and not inside(path):
            raise PermissionError("sandbox: writing outside the working directory is not allowed: %r" % (path,))
    elif event in PATH_ARGS:
        if any(not inside(args[i]) for i in PATH_ARGS[event]):
            raise PermissionError("sandbox: " + event + " outside the working directory is not allowed")
sys.addaudithook(hook)
del hook
linecache.cache["<tool_code>"] = (len(src), None, src.splitlines(True), "<tool_code>")
g = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    tree = ast.parse(src, "<tool_code>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<tool_code>", "exec"), g)
    value = None if last is None else eval(compile(ast.Expression(last.value), "<tool_code>", "eval"), g)
    if value is not None:
        with open(display_fd, "w") as f:
            f.write(repr(value))
except SystemExit as e:
    if e.code not in (None, 0):
        print("SystemExit:", e.code, file=sys.stderr)
        os._exit(1)
except BaseException as e:
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<tool_code>":
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)
    sys.stderr.flush()
    os._exit(1)
'''
