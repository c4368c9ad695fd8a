"""The seccomp filter bwrap installs (``--seccomp FD``) right before it starts the tool code.

Why a filter on top of the namespaces: the kernel surface the namespaces leave open is where the
hostile pass got through. A root trainer's sandbox has no user namespace of its own, so the code
could make one (``unshare -Ur``) and hold every capability inside it; vsock is not namespaced (one
port space with the host); keyrings belong to the uid and outlive a call; io_uring is a large,
bug-prone surface; inotify and fanotify watch files bound read-only from the host, so tool code
saw host processes and concurrent calls open them (a channel out of the call); Linux AIO's
``io_setup`` reserves events from the system-wide ``fs.aio-max-nr`` (one call took all 65,536).
Each is refused with ``EPERM``, which the code sees as an ordinary
``PermissionError``. ``clone3`` gets ``ENOSYS``: its flags sit behind a pointer a filter cannot read,
and glibc then falls back to ``clone``, whose flags (argument 0) are checked for namespace bits.

The program is classic BPF over ``struct seccomp_data`` (``nr`` at 0, ``arch`` at 4, ``args[i]``
at 16 + 8 i, little-endian), assembled here so nothing outside the standard library is needed.
A syscall of another ABI than the machine's own (i386 through ``int 0x80``, x32) is refused whole.
"""

from __future__ import annotations

import errno
import platform
import socket
import struct

# linux/audit.h; the syscall numbers: asm/unistd_64.h (x86_64), asm-generic/unistd.h (aarch64)
ARCHES = {
    "x86_64": (0xC000003E, {
        "socket": 41, "socketpair": 53, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
        "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300, "io_setup": 206,
        "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210, "io_pgetevents": 333}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "socketpair": 199, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
        "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "inotify_init1": 26, "fanotify_init": 262, "io_setup": 0, "io_destroy": 1,
        "io_submit": 2, "io_cancel": 3, "io_getevents": 4, "io_pgetevents": 292}),
}
REFUSED = ("unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig",
           "fsmount", "fspick", "mount_setattr", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl",
           "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open",
           "userfaultfd", "inotify_init", "inotify_init1", "fanotify_init", "io_setup", "io_destroy", "io_getevents",
           "io_submit", "io_cancel", "io_pgetevents")
"""Refused with EPERM; a name the architecture has no such call for (aarch64 has no ``inotify_init``,
only ``inotify_init1``) is skipped there."""
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (linux/sched.h); CLONE_NEWTIME
# (0x80) is not a clone() flag: that bit is part of the exit signal there.
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
X32_SYSCALL_BIT = 0x40000000

# linux/filter.h, linux/seccomp.h
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (``platform.machine()`` by default) as bwrap reads it: packed
    ``struct sock_filter`` entries. Raises ``ValueError`` for an architecture without a table."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise ValueError(f"no seccomp table for {machine!r}: the sandbox knows {sorted(ARCHES)}")
    arch, nr = ARCHES[machine]
    code: list[tuple] = [(_LD_ABS_W, 4), (_JEQ, arch, None, "eperm"), (_LD_ABS_W, 0)]
    if machine == "x86_64":
        code.append((_JGE, X32_SYSCALL_BIT, "eperm", None))
    code += [(_JEQ, nr[name], "eperm", None) for name in REFUSED if name in nr]
    code += [(_JEQ, nr["clone3"], "enosys", None), (_JEQ, nr["socket"], "family", None),
             (_JEQ, nr["socketpair"], "family", None), (_JEQ, nr["clone"], "clone", None), (_RET, RET_ALLOW),
             "family", (_LD_ABS_W, 16), (_JEQ, socket.AF_UNIX, "allow", "eperm"),
             "clone", (_LD_ABS_W, 16), (_JSET, CLONE_NAMESPACES, "eperm", "allow"),
             "allow", (_RET, RET_ALLOW),
             "eperm", (_RET, RET_ERRNO | errno.EPERM),
             "enosys", (_RET, RET_ERRNO | errno.ENOSYS)]
    return _assemble(code)


def _assemble(code: list) -> bytes:
    """Resolve labels (the strings) into the forward offsets jumps take; ``None`` = next one."""
    labels, index = {}, 0
    for item in code:
        if isinstance(item, str):
            labels[item] = index
        else:
            index += 1
    out, index = [], 0
    for item in code:
        if isinstance(item, str):
            continue
        op, k, *targets = item
        jt, jf = ((0 if t is None else labels[t] - index - 1) for t in (targets or (None, None)))
        out.append(struct.pack("=HBBI", op, jt, jf, k))
        index += 1
    return b"".join(out)
