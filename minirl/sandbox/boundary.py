"""The OS boundary around tool code (docs/sandbox.md): one ``Call`` per tool call.

Why an OS boundary: the in-process audit hook of ``minirl.sandbox`` lives in the same interpreter
as the code it guards, so that code can reach and disable it (PEP 578: audit hooks are not a
security boundary). The kernel has to say no instead. ``bwrap`` (Debian's ``bubblewrap``) puts
the interpreter in fresh mount, PID, network, IPC and UTS namespaces with ``no_new_privs``: the
filesystem is a read-only view of ``/usr``, ``/etc`` and the Python install, the only writable
path is a size-capped tmpfs that lives and dies with the sandbox (the parent never walks a tree
the code wrote), ``/proc`` shows the sandbox's own processes only, the only interface is ``lo``.
A seccomp filter (``minirl.sandbox.seccomp``) closes what namespaces leave open, and a cgroup per
call (``minirl.sandbox.cgroup``) bounds the call's memory and processes and ends it whole. The
uid is never root: a root parent runs bwrap without a user namespace and ``setpriv`` drops to a
uid of its own for the call (no capabilities, empty bounding set) before Python starts; any other
parent runs bwrap in a user namespace as itself.

Where this cannot work (no bwrap, no cgroup, or the kernel refuses the namespaces), tool code is
refused with the reason (``SandboxUnavailable``) unless ``MLAB_SANDBOX=audit-only`` names the
weaker mode: the audit hook and rlimits only, in a temp dir on the host, with the trainer's uid.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile

from minirl.sandbox import seccomp
from minirl.sandbox.cgroup import CallCgroup

MODE_ENV = "MLAB_SANDBOX"
MODES = ("bwrap", "audit-only")  # the default first
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")  # read-only view
WORKDIR = "/sandbox"  # the code's only writable dir, inside the boundary: a tmpfs of WORKDIR_BYTES
WORKDIR_BYTES = 64 << 20  # the disk a call can fill (its pages count against the call's memory too)
# A root trainer runs each call as its own uid from this range, claimed with a lock file for the
# call's lifetime: per-uid counters (RLIMIT_NPROC, inotify instances, pipe buffers, pending signals)
# are then the call's own. Above what Debian (< 65536), subordinate ids (100000 + 65536 n) and
# systemd-nspawn (524288-1879048191) hand out; no file on the host belongs to these uids.
UID_BASE, UID_COUNT = 2_000_000_000, 4096
UID_LOCK_DIR = "/run/minirl-sandbox-uids"


class SandboxUnavailable(RuntimeError):
    """The OS boundary cannot run here; raised (not returned to the model) because every tool
    call would fail the same way and training on that would be silent garbage."""


def sandbox_mode() -> str:
    """The mode ``MLAB_SANDBOX`` names (unset: ``bwrap``)."""
    mode = os.environ.get(MODE_ENV, MODES[0])
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: must be one of {MODES}; unset it for the OS boundary "
                         f"(bwrap), or set 'audit-only' to accept the weaker in-process audit hook")
    return mode


def check_sandbox() -> str:
    """The mode, once it is known to work here. Raises ``ValueError`` for an unknown
    ``MLAB_SANDBOX`` and ``SandboxUnavailable`` (with the reason and the fix) where bwrap cannot
    run; call it before a run starts to fail at once rather than at the first tool call."""
    mode = sandbox_mode()
    if mode == "bwrap" and (reason := _probe()):
        raise SandboxUnavailable(
            f"tool code is refused: the bwrap sandbox does not work on this machine ({reason}). Fix: "
            f"install Debian's bubblewrap (`make debs` as root) and run as root (a cgroup per call needs the "
            f"memory and pids controllers: root, or a delegated cgroup v2), on a kernel that allows user "
            f"namespaces (sysctl user.max_user_namespaces > 0) for a non-root trainer; or set "
            f"{MODE_ENV}=audit-only to run tool code behind the in-process audit hook only (weaker: not a "
            f"security boundary)")
    return mode


class Call:
    """One tool call's boundary. ``workdir`` is the code's writable dir as the code sees it, ``cwd``
    where the parent starts ``command(argv)``, ``fds`` what the command inherits. ``close()`` kills
    every process of the call and waits until none is left, then frees what the call held; it is
    idempotent, and the parent reads no result before it."""

    def __init__(self, memory_bytes: int, max_processes: int) -> None:
        self.fds: tuple[int, ...] = ()
        self._cgroup: CallCgroup | None = None
        self._uid_lock: int | None = None
        if sandbox_mode() == "audit-only":
            self.workdir = self.cwd = tempfile.mkdtemp(prefix="minirl-sandbox-")
            return
        self.workdir, self.cwd = WORKDIR, "/"
        try:
            uid = None
            if os.geteuid() == 0:
                uid, self._uid_lock = _claim_uid()
            self._cgroup = CallCgroup(memory_bytes, max_processes)
            self.fds = (memfd("seccomp", seccomp.program()),)
            self._bwrap = _bwrap_argv(self.fds[0], uid)
        except BaseException:
            self.close()
            raise

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` (a Python command) inside the boundary."""
        return argv if self._cgroup is None else self._cgroup.command([*self._bwrap, *argv])

    def oom_kills(self) -> int:
        """Processes of the call the kernel killed at its memory limit so far (0 without a cgroup:
        ``audit-only`` has only the rlimits, which fail an allocation instead of killing)."""
        return 0 if self._cgroup is None else self._cgroup.oom_kills()

    def close(self) -> None:
        """If the kill fails (it raises), the uid stays claimed: its processes may still run."""
        if self._cgroup is not None:
            self._cgroup.kill()
            self._cgroup.remove()
            self._cgroup = None
        for fd in (*self.fds, *([self._uid_lock] if self._uid_lock is not None else [])):
            os.close(fd)
        self.fds, self._uid_lock = (), None
        if self.workdir != WORKDIR:
            remove_tree(self.workdir)


@functools.lru_cache(maxsize=1)
def _probe() -> str:
    """Why bwrap cannot run a trivial Python here ('' when it can). Probed once per process,
    through the same ``Call`` a tool call uses (cgroup, seccomp filter, uid)."""
    needed = ("bwrap", "setpriv") if os.geteuid() == 0 else ("bwrap",)
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH"
    try:
        call = Call(256 << 20, 16)
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    try:
        probe = subprocess.run(call.command([python_executable(), "-I", "-S", "-c", "pass"]), cwd=call.cwd,
                               pass_fds=call.fds, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        call.close()
    return "" if probe.returncode == 0 else f"exit {probe.returncode}: {probe.stderr.strip()[-500:]}"


def python_executable() -> str:
    """The real interpreter (a venv's ``bin/python`` is a link into the base install)."""
    return os.path.realpath(sys.executable)


def _claim_uid() -> tuple[int, int]:
    """A uid of the range no running call holds, and the fd of its lock (held until closed; the
    kernel drops it if the trainer dies). Locks work across trainer processes (pytest-xdist)."""
    os.makedirs(UID_LOCK_DIR, mode=0o700, exist_ok=True)
    for uid in range(UID_BASE, UID_BASE + UID_COUNT):
        fd = os.open(os.path.join(UID_LOCK_DIR, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return uid, fd
        except BlockingIOError:
            os.close(fd)
    raise OSError(f"all {UID_COUNT} sandbox uids are in use ({UID_LOCK_DIR})")


def memfd(name: str, data: bytes) -> int:
    """An anonymous file holding ``data``, read from its start by whoever inherits it."""
    fd = os.memfd_create(name)  # close-on-exec: only a child naming it in pass_fds gets it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _bwrap_argv(seccomp_fd: int, uid: int | None) -> list[str]:
    """Namespaces, the read-only view, the sized tmpfs workdir, no ptys, the seccomp filter, then
    the uid. bwrap is looked up on the trainer's ``PATH`` as the probe did (the sandbox's own
    ``PATH`` is ``/usr/bin:/bin``). ``/dev/pts`` is an empty read-only tmpfs: a pty is a kernel-wide
    resource (``kernel.pty.max``) the code could exhaust, and tool code has no terminal to need."""
    cmd = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--tmpfs", "/"]
    for top in SYSTEM_DIRS:
        if os.path.islink(top):  # merged /usr: /bin -> usr/bin
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    roots = _python_roots()
    for parent in _ancestors(roots):  # bwrap would make them 0700 root: untraversable
        cmd += ["--perms", "0755", "--dir", parent]
    for root in roots:
        cmd += ["--ro-bind", root, root]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts",
            "--perms", "01777", "--size", str(WORKDIR_BYTES), "--tmpfs", WORKDIR, "--chdir", WORKDIR,
            "--remount-ro", "/", "--seccomp", str(seccomp_fd)]
    if uid is not None:  # root: no user namespace, mounts as root, then setpriv drops every privilege
        cmd[1:1] = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        return [*cmd, "--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--"]
    cmd[1:1] = ["--unshare-user", "--disable-userns"]
    return [*cmd, "--"]


def _python_roots() -> list[str]:
    """The install trees the interpreter needs, outside the system dirs bound anyway."""
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python_executable()))}
    system = tuple(os.path.realpath(d) + os.sep for d in SYSTEM_DIRS if os.path.isdir(d))
    outside = [r for r in sorted(roots) if not (r + os.sep).startswith(system)]
    return [r for r in outside if not any(r.startswith(o + os.sep) for o in outside if o != r)]


def _ancestors(paths: list[str]) -> list[str]:
    """Every directory above ``paths`` (not ``/``), parents first, each once."""
    found: list[str] = []
    for path in paths:
        parts = path.strip(os.sep).split(os.sep)[:-1]
        for depth in range(1, len(parts) + 1):
            parent = os.sep + os.path.join(*parts[:depth])
            if parent not in found:
                found.append(parent)
    return found


def remove_tree(path: str) -> None:
    """Remove an audit-only temp dir whatever the code did to it; a non-root trainer's code may
    have taken its own permissions away (``chmod 0``), so those are given back first."""
    try:
        shutil.rmtree(path)  # fd-based on Linux: never follows a link
    except FileNotFoundError:
        pass
    except OSError:
        _give_owner_access(path)
        shutil.rmtree(path)


def _give_owner_access(path: str, dir_fd: int | None = None) -> None:
    """Make ``path`` and every directory below it 0700, never through a link: each is pinned by an
    ``O_PATH | O_NOFOLLOW`` fd (a link is refused) and changed through that fd, so a name swapped
    for a link meanwhile (code still running) changes nothing outside."""
    pinned = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{pinned}", 0o700)  # the pinned inode, whatever the name is now
        fd = os.open(f"/proc/self/fd/{pinned}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(pinned)
    try:
        for name in os.listdir(fd):
            try:
                _give_owner_access(name, fd)
            except OSError as e:  # not a directory (any more): rmtree unlinks it as it is
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise
    finally:
        os.close(fd)
