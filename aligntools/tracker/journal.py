"""The crash-safe journal a streaming capture writes to: ``.NAME.partial/`` next to ``NAME``.

Why a journal: HDF5 is not crash-safe by design, and a zarr store whose arrays are resized
one by one is inconsistent between two resizes, so a ``kill -9`` mid-flush left unreadable
files. Here every flushed block is one self-contained ``.npz`` file (no pickle), written to a
temporary name and renamed in; then ``journal.json`` (specs, attrs, the ordered list of
entries, ``n_rows``) is rewritten the same way. A rename is atomic, so at any moment the
directory holds a consistent prefix of the capture: entries not yet listed are ignored.

When the run finishes, the journal is converted into the ``.nc`` / ``.zarr`` the user asked
for (``files.publish``: temporary sibling, renamed over the target) and removed. When it
does not (exception, budget, kill), the journal stays and ``Capture.load(NAME)`` reads it
(marked partial); an older file at ``NAME`` is never touched by a run that did not finish.

One writer per path: a second writer would start the journal again under the first one's
feet (its rows lost). ``WriterLock`` holds an ``flock`` on ``.NAME.lock`` for the writer's
life; the kernel drops it when the process dies, so a killed run never blocks the next one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

import numpy as np

from aligntools.tracker.files import check_target, publish, write_capture
from aligntools.tracker.store import CaptureWriteError, MemoryStore, Store, VarSpec, plain_attrs

INDEX = "journal.json"
FORMAT = 1


def partial_path(path: str | os.PathLike) -> Path:
    """Where a streaming capture of ``path`` keeps its journal until it finishes."""
    p = Path(path)
    return p.with_name(f".{p.name}.partial")


def is_journal(path: Path) -> bool:
    return path.is_dir() and (path / INDEX).is_file()


class WriterLock:
    """An exclusive ``flock`` on ``.NAME.lock`` beside the target, held until ``release``.

    ``flock`` locks belong to an open file description, so a second writer is refused in
    the same process as in another one. ``release`` removes the file while still holding
    the lock; a writer that opened the file just before checks, once locked, that it still
    names the path (else it retries on the new file), so two writers never hold two locks.
    """

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(f".{path.name}.lock")
        self._fd: int | None = None
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise CaptureWriteError(
                    errno.EBUSY, f"another writer (pid {holder}) is capturing to {path} (it holds {self.path}); "
                                 f"refusing to start a second one, which would discard its journal. Give this "
                                 f"capture another `out` path, or wait until that writer closes") from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder released and removed it between our open and our lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


class JournalStore:
    """``Store`` that appends to a journal and publishes ``path`` on a complete ``close``."""

    def __init__(self, path: Path, attrs: dict) -> None:
        self.path, self.dir = path, partial_path(path)
        check_target(path)
        if self.dir.exists() and not is_journal(self.dir):
            raise CaptureWriteError(f"{self.dir} exists and is not a capture journal; refusing to overwrite "
                                    f"it. Remove or rename it, or capture to another path")
        self._attrs = plain_attrs(attrs)
        self._specs: dict[str, VarSpec] = {}
        self._entries: list[list] = []
        self._n = 0
        with self._writing():
            path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = WriterLock(path)
        try:
            with self._writing():
                if self.dir.exists():
                    shutil.rmtree(self.dir)  # an earlier unfinished run of the same path (ours: no writer holds it)
                self.dir.mkdir(parents=True)
                self._commit()
        except BaseException:
            self._lock.release()
            raise

    def append(self, specs: dict[str, VarSpec], block: dict[str, np.ndarray], n_rows: int) -> None:
        for name in block:
            self._specs.setdefault(name, specs[name])
        with self._writing():
            self._entries.append(["rows", self._npz("rows", block), n_rows])
            self._n += n_rows
            self._commit()

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        with self._writing():
            self._entries.append(["patch", self._npz("patch", {"rows": rows, "values": values}), name])
            self._commit()

    def set_static(self, name: str, spec: VarSpec, values: np.ndarray) -> None:
        self._specs[name] = spec
        with self._writing():
            self._entries.append(["static", self._npz("static", {"values": values}), name])
            self._commit()

    def close(self, attrs: dict) -> None:
        """Record the final attrs; if ``complete``, write ``path`` and drop the journal; then
        let the next writer in."""
        try:
            self._finish(attrs)
        finally:
            self._lock.release()

    def _finish(self, attrs: dict) -> None:
        self._attrs = plain_attrs({**self._attrs, **attrs})
        with self._writing():
            self._commit()
        if not int(self._attrs.get("complete", 0)):
            return
        try:
            n_bytes = sum(f.stat().st_size for f in self.dir.glob("*.npz"))
            publish(self.path, lambda tmp, fmt: write_capture(
                tmp, fmt, self._attrs, self._n, n_bytes, lambda w: replay_into(self.dir, w, close=False)), n_bytes)
        except CaptureWriteError as e:
            raise CaptureWriteError(e.errno, f"{e.strerror}; every row is kept in the journal {self.dir} "
                                             f"(Capture.load reads it)") from e
        shutil.rmtree(self.dir, ignore_errors=True)

    def _npz(self, kind: str, arrays: dict[str, np.ndarray]) -> str:
        name = f"{kind}-{len(self._entries):06d}.npz"
        tmp = self.dir / f"{name}.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, self.dir / name)
        return name

    def _commit(self) -> None:
        index = {"format": FORMAT, "n_rows": self._n, "attrs": self._attrs, "entries": self._entries,
                 "specs": {n: {"dims": list(s.dims), "dtype": s.dtype.str, "attrs": plain_attrs(s.attrs)}
                           for n, s in self._specs.items()}}
        tmp = self.dir / f"{INDEX}.tmp"
        tmp.write_text(json.dumps(index))
        os.replace(tmp, self.dir / INDEX)

    def _writing(self) -> "_WriteErrors":
        return _WriteErrors(self.path, self.dir)


class _WriteErrors:
    """Turns an OSError of a journal write (ENOSPC, EACCES) into one ``CaptureWriteError``."""

    def __init__(self, path: Path, journal: Path) -> None:
        self.path, self.journal = path, journal

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and issubclass(exc_type, OSError) and not isinstance(exc, CaptureWriteError):
            raise CaptureWriteError(exc.errno, f"cannot write capture {self.path} (journal {self.journal}): "
                                               f"{exc.strerror or exc}") from exc


def open_store(path: str | os.PathLike | None, attrs: dict) -> Store:
    """A store for ``path``: ``None`` keeps rows in memory; a path streams to a crash-safe
    journal next to it (``.NAME.partial``) that becomes ``path`` when the run finishes.

    The target is checked first (``files.check_target``): a directory or file that is not a
    capture is refused, never overwritten.
    """
    if path is None:
        return MemoryStore(attrs)
    return JournalStore(Path(path), attrs)


def read_index(journal: Path) -> dict:
    index = json.loads((journal / INDEX).read_text())
    if index.get("format") != FORMAT:
        raise ValueError(f"unknown journal format {index.get('format')!r} (this reader knows {FORMAT})")
    return index


def replay_into(journal: Path, store: Store, close: bool = True) -> dict:
    """Feed the journal's entries, in order, to ``store`` (a MemoryStore to read it, a file
    writer to publish it); returns the journal's attrs."""
    index = read_index(journal)
    specs = {n: VarSpec(tuple(s["dims"]), np.dtype(s["dtype"]), s["attrs"]) for n, s in index["specs"].items()}
    for kind, file, arg in index["entries"]:
        with np.load(journal / file, allow_pickle=False) as z:
            if kind == "rows":
                store.append(specs, {k: z[k] for k in z.files}, int(arg))
            elif kind == "patch":
                store.write_rows(arg, z["rows"], z["values"])
            else:
                store.set_static(arg, specs[arg], z["values"])
    if close:
        store.close(index["attrs"])
    return index["attrs"]


def load_journal(journal: Path):
    """The rows a journal holds, as an xarray.Dataset (everything listed in its index)."""
    store = MemoryStore({})
    replay_into(journal, store)
    return store.dataset()
