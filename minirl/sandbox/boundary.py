"""The OS boundary around tool code (docs/sandbox.md), and the parent's side of the temp dir.

Why an OS boundary: the in-process audit hook of ``minirl.sandbox`` lives in the same interpreter
as the code it guards, so that code can reach and disable it (PEP 578: audit hooks are not a
security boundary). The kernel has to say no instead. ``bwrap`` (Debian's ``bubblewrap``) puts
the interpreter in fresh mount, PID, network, IPC and UTS namespaces with ``no_new_privs``: the
filesystem is a read-only view of ``/usr``, ``/etc`` and the Python install, the temp dir is the
only writable path, ``/proc`` shows the sandbox's own processes only, the only interface is
``lo``. The uid is never root: a root parent runs bwrap without a user namespace and ``setpriv``
drops to ``SANDBOX_UID`` (no capabilities, empty bounding set) before Python starts; any other
parent runs bwrap in a user namespace as itself.

Where this cannot work (no bwrap, or the kernel refuses the namespaces), tool code is refused
with the reason (``SandboxUnavailable``) unless ``MLAB_SANDBOX=audit-only`` names the weaker
mode: the audit hook and rlimits only, the code running with the trainer's uid.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
import tempfile

MODE_ENV = "MLAB_SANDBOX"
MODES = ("bwrap", "audit-only")  # the default first
SANDBOX_UID = 65534  # "nobody" on Debian: owns no file the sandbox could read or change
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")  # read-only view


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


def make_workdir() -> str:
    """A fresh temp dir the sandbox uid may write (and nothing else of the host)."""
    workdir = tempfile.mkdtemp(prefix="minirl-sandbox-")
    if os.geteuid() == 0 and sandbox_mode() == "bwrap":
        os.chown(workdir, SANDBOX_UID, SANDBOX_UID)
    return workdir


def check_sandbox() -> str:
    """The mode, once it is known to work here. Raises ``ValueError`` for an unknown
    ``MLAB_SANDBOX`` and ``SandboxUnavailable`` (with the reason and the fix) where bwrap cannot
    run; call it before a run starts to fail at once rather than at the first tool call."""
    mode = sandbox_mode()
    if mode == "bwrap" and (reason := _probe()):
        raise SandboxUnavailable(
            f"tool code is refused: the bwrap sandbox does not work on this machine ({reason}). Fix: "
            f"install Debian's bubblewrap (`make debs` as root) on a kernel that allows user namespaces "
            f"(sysctl user.max_user_namespaces > 0) or run as root; or set {MODE_ENV}=audit-only to run "
            f"tool code behind the in-process audit hook only (weaker: not a security boundary)")
    return mode


def wrap(argv: list[str], workdir: str) -> list[str]:
    """``argv`` (a Python command) inside the boundary the mode asks for (``check_sandbox`` first)."""
    return argv if sandbox_mode() == "audit-only" else _bwrap_argv(argv, workdir)


@functools.lru_cache(maxsize=1)
def _probe() -> str:
    """Why bwrap cannot run a trivial Python here ('' when it can). Probed once per process."""
    needed = ("bwrap", "setpriv") if os.geteuid() == 0 else ("bwrap",)
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH"
    workdir = make_workdir()
    try:
        probe = subprocess.run(_bwrap_argv([python_executable(), "-I", "-S", "-c", "pass"], workdir),
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        remove_tree(workdir)
    return "" if probe.returncode == 0 else f"exit {probe.returncode}: {probe.stderr.strip()[-500:]}"


def python_executable() -> str:
    """The real interpreter (a venv's ``bin/python`` is a link into the base install)."""
    return os.path.realpath(sys.executable)


def _bwrap_argv(argv: list[str], workdir: str) -> list[str]:
    """Namespaces, the read-only view, the writable temp dir, then the uid. bwrap is looked up
    on the trainer's ``PATH`` as the probe did (the sandbox's own ``PATH`` is ``/usr/bin:/bin``)."""
    cmd = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--tmpfs", "/"]
    for top in SYSTEM_DIRS:
        if os.path.islink(top):  # merged /usr: /bin -> usr/bin
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    roots = _python_roots()
    for parent in _ancestors([*roots, workdir]):  # bwrap would make them 0700 root: untraversable
        cmd += ["--perms", "0755", "--dir", parent]
    for root in roots:
        cmd += ["--ro-bind", root, root]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--bind", workdir, workdir, "--chdir", workdir, "--remount-ro", "/"]
    if os.geteuid() == 0:  # no user namespace: mounts as root, then setpriv drops every privilege
        cmd[1:1] = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        return [*cmd, "--", "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--", *argv]
    cmd[1:1] = ["--unshare-user", "--disable-userns"]
    return [*cmd, "--", *argv]


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


def read_result_file(path: str, limit: int) -> tuple[str | None, str]:
    """``(text, "")`` for a regular file (``""`` if absent), at most ``limit`` bytes; ``(None,
    why)`` for anything else. Never follows a link nor blocks: the sandbox may have replaced the
    file by a FIFO (an open would wait for a writer forever) or a link to ``/dev/zero``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "", ""
    except OSError as e:
        return None, f"{os.path.basename(path)} could not be opened safely ({e.strerror})"
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind != stat.S_IFREG:
            return None, f"{os.path.basename(path)} is not a regular file (mode {kind:#o})"
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("\n... [result cut]" if len(data) > limit else ""), ""


def remove_tree(path: str) -> None:
    """Remove the temp dir whatever the code did to it; a non-root sandbox may have taken its
    own permissions away (``chmod 0``), so those are given back first, never following links."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError:
        _give_owner_access(path)
        shutil.rmtree(path)


def _give_owner_access(path: str, dir_fd: int | None = None) -> None:
    """``path`` is a directory (checked by the caller without following links; the sandbox is
    dead by now, so it cannot be swapped for a link in between)."""
    os.chmod(path, 0o700, dir_fd=dir_fd)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        for name in os.listdir(fd):
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                _give_owner_access(name, fd)
    finally:
        os.close(fd)
