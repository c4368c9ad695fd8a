"""Checks of a path a command is about to write, made before anything is written there.

Why: every writer here replaces its target through a temporary sibling and a rename, so a
crash never leaves half a file. Pointed at a device node (``/dev/full``), a FIFO or a socket,
that rename silently replaced the node with a regular file; pointed at an existing capture or
run log, it overwrote data no re-run gives back; and in a directory that holds no new files
(``/proc``) the temporary sibling failed with a bare "No such file or directory" about a file
that exists. Torch-free, so any command can check its output before loading a model.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

DATA_MAGIC = (b"\x89HDF\r\n\x1a\n", b"CDF\x01", b"CDF\x02")
"""First bytes of HDF5 / netCDF files: captures, run logs (metrics.nc) and data sets, which no
report, figure or checkpoint may replace."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def describe_mode(mode: int) -> str:
    """What a ``st_mode`` is, in words ("a FIFO", "a symlink", ...), for messages that name it."""
    kinds = ((stat.S_ISLNK, "a symlink"), (stat.S_ISREG, "a regular file"), *_KINDS)
    return next((kind for is_kind, kind in kinds if is_kind(mode)), "not a file")


class OutputPathError(OSError):
    """An output path that must not or cannot be written; the message names the path and why."""


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a ``Path`` when a file write may replace it: it does not exist yet, or it is a
    regular file holding no HDF5/netCDF data. Anything else raises ``OutputPathError`` naming it.

    A symlink is judged by what it points to: a link to ``/dev/full`` is refused like the device.
    Whether a new file can be created there is not probed here (``temp_sibling`` says why not
    when it cannot), so a command may check its output before hours of work and still write at
    the end."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return p  # a new path; its directory is the writer's to create (temp_sibling names a failure)
    except OSError as e:
        raise OutputPathError(f"cannot write {what} to {p}: {e.strerror or e}") from e
    for is_kind, kind in _KINDS:
        if is_kind(mode):
            raise OutputPathError(f"cannot write {what} to {p}: it is {kind}; a {what} replaces its target with a "
                                  f"regular file, so give a new path or a regular file")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise OutputPathError(f"cannot write {what} to {p}: it cannot be read to check what it holds "
                              f"({e.strerror or e}); give a new path") from e
    if head.startswith(DATA_MAGIC):
        raise OutputPathError(f"cannot write {what} to {p}: it is an HDF5/netCDF file (a capture, a run log or a "
                              f"data set); refusing to replace it. Give a new path, or remove the file yourself")
    return p


def check_parents(path: str | os.PathLike, what: str) -> None:
    """Refuse (``OutputPathError``) a ``path`` whose directories can never be created: one of
    them is a file, or a symlink to nothing (``mkdir`` says only "File exists" of it). Reads
    only, so a command may check before its slow imports, even where the output already exists."""
    p = Path(path)
    parents = (p.parent, *p.parent.parents)
    blocker = next((d for d in parents if d.exists() and not d.is_dir()), None)
    if blocker is not None:
        raise OutputPathError(f"cannot write {what} to {p}: {blocker} is not a directory")
    dangling = next((d for d in parents if d.is_symlink() and not d.exists()), None)
    if dangling is not None:
        raise OutputPathError(f"cannot write {what} to {p}: {dangling} is a symlink to {os.readlink(dangling)}, "
                              f"which does not exist; create that directory, or give another path")


def temp_sibling(path: str | os.PathLike, what: str) -> tuple[int, Path]:
    """``(fd, tmp)``: a new empty file beside ``path`` (its directories created), to be written
    and renamed over ``path``. A failure raises ``OutputPathError`` with the real reason: a
    parent that is a file, or a directory that takes no new files (``/proc``)."""
    p = Path(path)
    parent = p.parent
    check_parents(p, what)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"cannot write {what} to {p}: cannot create directory {parent}: "
                              f"{e.strerror or e}") from e
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        why = ("the file system there takes no new files" if e.errno == errno.ENOENT and parent.is_dir()
               else e.strerror or str(e))
        raise OutputPathError(f"cannot write {what} to {p}: cannot create a file in {parent} (a {what} is "
                              f"written to a temporary file there, then renamed): {why}") from e
    return fd, Path(tmp)


def check_directory_takes_files(path: str | os.PathLike, what: str) -> None:
    """Create and remove a file beside ``path``, so a command whose output (or lock file) can
    never be written there fails now, naming the reason, instead of after its work or in a
    lock's retry loop that waits forever on a file it cannot create."""
    fd, tmp = temp_sibling(path, what)
    os.close(fd)
    tmp.unlink()
