"""One cgroup per tool call: memory and process count are bounded for the call, not per process,
and the call ends only when the cgroup is empty.

Why: rlimits are per process (``RLIMIT_AS``: 8 children of a 256 MiB call took 2.2 GiB) or per uid
(``RLIMIT_NPROC``: concurrent calls starved each other), and killing bwrap left sandbox processes
running while the parent read results. A cgroup holds every process the call makes, whatever it
forks, and lists them, so the parent can SIGKILL them all and wait until none is left.

Both layouts are handled: cgroup v1 (a hierarchy per controller, as on this machine: the memory
and pids hierarchies) and v2 (one unified hierarchy whose ``cgroup.controllers`` lists both). The
call's cgroup is made below the trainer's own, so limits put on the trainer still hold. The
process enters it before bwrap starts: a ``sh`` writes its own pid into each ``cgroup.procs``,
then ``exec``s the command (no ``preexec_fn``: tool calls run in threads).
"""

from __future__ import annotations

import itertools
import os
import signal
import time

CONTROLLERS = ("memory", "pids")
OOM_COUNTS = ("memory.events", "memory.oom_control")  # v2, v1: each holds an "oom_kill N" line
KILL_WAIT_S = 10.0  # SIGKILLed processes are gone in milliseconds; past this the kernel is stuck
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
_names = itertools.count()


class CallCgroup:
    """The call's cgroup in each hierarchy holding a controller of ``CONTROLLERS``. Raises
    ``OSError`` (with the path) where a cgroup cannot be made or limited, e.g. a non-root trainer
    without a delegated cgroup."""

    def __init__(self, memory_bytes: int, max_processes: int) -> None:
        name = f"minirl-sandbox-{os.getpid()}-{next(_names)}"
        self.dirs: list[str] = []
        try:
            for parent, v2 in _parents():
                path = os.path.join(parent, name)
                os.mkdir(path, 0o700)
                self.dirs.append(path)
                for file, value in _limits(memory_bytes, max_processes, v2).items():
                    if os.path.exists(os.path.join(path, file)):  # each v1 hierarchy has its own files
                        _write(os.path.join(path, file), str(value))
        except BaseException:
            self.remove()
            raise

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the cgroup, before it can fork."""
        return ["/bin/sh", "-c", _JOIN, "sh", *(os.path.join(d, "cgroup.procs") for d in self.dirs), "--", *argv]

    def pids(self) -> list[int]:
        with open(os.path.join(self.dirs[0], "cgroup.procs")) as f:
            return [int(line) for line in f]

    def oom_kills(self) -> int:
        """How many processes of the call the kernel killed for reaching its memory limit: the
        ``oom_kill`` count of v2's ``memory.events`` or v1's ``memory.oom_control`` (0 where the
        kernel keeps no count)."""
        for d in self.dirs:
            for file in OOM_COUNTS:
                try:
                    with open(os.path.join(d, file)) as f:
                        counts = dict(line.split() for line in f if line.strip())
                except FileNotFoundError:
                    continue
                return int(counts.get("oom_kill", 0))
        return 0

    def kill(self) -> None:
        """SIGKILL every process of the call and return once none is left. A pid is signalled
        through a pidfd taken while it is still listed, so a reused pid is never hit."""
        deadline = time.monotonic() + KILL_WAIT_S
        while pids := self.pids():
            for pid in pids:
                self._kill_member(pid)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(pids)} sandbox processes survived SIGKILL for {KILL_WAIT_S:g} s "
                                   f"({self.dirs[0]})")
            time.sleep(0.002)

    def _kill_member(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            if pid in self.pids():
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Remove the (empty) cgroups; idempotent."""
        while self.dirs:
            try:
                os.rmdir(self.dirs[-1])
            except FileNotFoundError:
                pass
            self.dirs.pop()


def _limits(memory_bytes: int, max_processes: int, v2: bool) -> dict[str, int]:
    """The limit files and values; swap is not allowed at all (the swap file is skipped where the
    kernel does not account swap)."""
    if v2:  # v2 counts swap apart from memory
        return {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": max_processes}
    return {"memory.limit_in_bytes": memory_bytes, "memory.memsw.limit_in_bytes": memory_bytes,
            "pids.max": max_processes}


def _parents() -> list[tuple[str, bool]]:
    """``(directory of the trainer's cgroup, is v2)`` for each hierarchy holding a controller."""
    v1, v2 = _cgroup_mounts()
    found: dict[str, tuple[str, bool]] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if names:  # v1: the line names its controllers
                for controller in set(names.split(",")) & set(CONTROLLERS) & set(v1):
                    found.setdefault(controller, (_directory(*v1[controller], path), False))
            elif v2 is not None:
                directory = _directory(*v2, path)
                with open(os.path.join(directory, "cgroup.controllers")) as c:
                    for controller in set(c.read().split()) & set(CONTROLLERS):
                        found.setdefault(controller, (directory, True))
    if missing := [c for c in CONTROLLERS if c not in found]:
        raise OSError(f"no cgroup hierarchy with the {' and '.join(missing)} controller is mounted here "
                      f"(/proc/self/cgroup, /proc/self/mountinfo)")
    parents = list(dict.fromkeys(found.values()))
    for directory, is_v2 in parents:
        if is_v2:  # children get the controllers only if the parent hands them down
            _write(os.path.join(directory, "cgroup.subtree_control"), " ".join(f"+{c}" for c in CONTROLLERS))
    return parents


def _cgroup_mounts() -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """``({v1 controller: (mount point, root)}, (mount point, root) of v2 or None)``."""
    v1: dict[str, tuple[str, str]] = {}
    v2 = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, where = fields[sep + 1], (fields[4], fields[3])
            if fstype == "cgroup2" and v2 is None:
                v2 = where
            elif fstype == "cgroup":
                for option in fields[sep + 3].split(","):
                    v1.setdefault(option, where)
    return v1, v2


def _directory(mount: str, root: str, path: str) -> str:
    """Where the cgroup ``path`` (as /proc/self/cgroup names it) is under a mount of ``root``."""
    return os.path.normpath(os.path.join(mount, os.path.relpath(path, root)))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)
