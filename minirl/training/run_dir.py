"""The run directory: what a run owns in ``out_dir``, and one run at a time there.

A run never deletes or overwrites a file it did not write. So that it can tell, it keeps a
*manifest*, ``.mlab-run.json``: the names it writes, added before each is first written. A
directory *holds a run* only if it has a manifest; ``--overwrite`` removes exactly the manifest's
entries and leaves everything else (named in a note). A directory without a manifest whose files
would collide with the run's (``config.yaml``, ``metrics.nc``, ...) is refused: they are someone
else's, and the fix is another ``out_dir``, never deleting them.

One run per directory: ``.mlab-run.lock`` is held with ``flock`` for the whole run and holds the
holder's pid. The kernel drops the lock when its process ends, ``kill -9`` included, so a crashed
run never blocks the next; and it needs no HDF5 file locking (often off on NFS/Lustre,
``HDF5_USE_FILE_LOCKING=FALSE``), which is what used to decide, half-way through, which of two
runs died.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

MANIFEST = ".mlab-run.json"
LOCK = ".mlab-run.lock"
OWNED = ("config.yaml", "metrics.nc", ".metrics.nc.tmp", "checkpoint", ".checkpoint.old", "curves.png")
"""what every run writes at the top of ``out_dir`` (``tensorboard/`` holds only the event files it lists)."""


class RunDirError(ValueError):
    """``out_dir`` cannot take this run; the message says why and what to do."""


class RunDir:
    """``out_dir``, locked for one run. ``open`` checks and locks; ``start`` clears the previous
    run (a fresh start) and writes the manifest; ``claim`` adds a name before it is written."""

    def __init__(self, out_dir: str | os.PathLike, fd: int) -> None:
        self.path, self._fd = Path(out_dir), fd
        self.entries: list[str] = read_manifest(self.path) or []

    @classmethod
    def open(cls, out_dir: str | os.PathLike, resume: bool, overwrite: bool = True) -> "RunDir":
        """Check that ``out_dir`` can take this run (``check``), then lock it; refused by name
        when another run holds it, before any file changes."""
        check(out_dir, resume, overwrite)
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(f"out_dir {out_dir} is in use by another run (pid {holder}, holding {path / LOCK}); "
                              f"wait for it to finish, or set another out_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            check(out_dir, resume, overwrite)  # again under the lock: the holder may have changed it
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def start(self) -> list[str]:
        """A fresh run: remove the previous run's entries, start a new manifest; -> the names
        of the files a replaced run left in place (not its own), [] when there was none."""
        replaced = bool(self.entries)
        for name in self.entries:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        for name in {str(Path(n).parent) for n in self.entries} - {"."}:  # e.g. tensorboard/, when left empty
            if (self.path / name).is_dir() and not any((self.path / name).iterdir()):
                (self.path / name).rmdir()
        self.entries = []
        self.claim(*OWNED)
        if not replaced:
            return []
        return sorted(p.name for p in self.path.iterdir() if p.name not in (*OWNED, MANIFEST, LOCK))

    def claim(self, *names: str) -> None:
        """Record ``names`` (relative to ``out_dir``) as the run's, before they are written."""
        new = [n for n in names if n not in self.entries]
        if new:
            self.entries += new
            tmp = self.path / f"{MANIFEST}.tmp"
            tmp.write_text(json.dumps({"files": self.entries}, indent=1))
            os.replace(tmp, self.path / MANIFEST)

    def close(self) -> None:
        """Release the lock (the lock file stays: removing it would race with the next run)."""
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def check(out_dir: str | os.PathLike, resume: bool, overwrite: bool) -> None:
    """Refuse (``RunDirError``) what ``out_dir`` cannot take, before anything loads: a run there
    and neither ``resume`` nor ``overwrite``; ``resume`` with no run or no checkpoint; files of
    someone else's where the run would write. (``out_dir: ''`` is refused with the config.)"""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"out_dir {out_dir} is a file, not a directory; set another out_dir")
    entries = read_manifest(path)
    if entries is None:
        if resume:
            raise RunDirError(f"--resume: {out_dir} holds no run (no {MANIFEST}), so there is nothing to resume; "
                              f"drop --resume to start a new run")
        foreign = sorted(n for n in OWNED if (path / n).exists() or (path / n).is_symlink())
        if foreign:
            raise RunDirError(f"out_dir {out_dir} has files no run wrote there ({', '.join(foreign)}; no {MANIFEST}); "
                              f"a run would overwrite them: set another out_dir")
        return
    if resume:
        _check_checkpoint(path, entries)
    elif not overwrite:
        present = ", ".join(n for n in entries if (path / n).exists())
        raise RunDirError(f"out_dir {out_dir} already holds a run ({present}); continue it with --resume, replace "
                          f"it with --overwrite (only the run's own files), or set another out_dir")


def _check_checkpoint(path: Path, entries: list[str]) -> None:
    """``--resume`` needs a checkpoint; say exactly why there is none."""
    ckpt, old = path / "checkpoint", path / ".checkpoint.old"
    if ckpt.is_dir() or (not ckpt.exists() and old.is_dir()):
        return  # its files are checked when it loads (``minirl.training.checkpointing``)
    if ckpt.exists():
        raise RunDirError(f"--resume: {ckpt} is a file, not a checkpoint directory; restore the checkpoint "
                          f"from a copy, or start again with --overwrite")
    saved = _saved_config(path)
    if saved.get("checkpoint_every") == 0:
        why = "its config has checkpoint_every: 0, which writes none"
    else:
        why = "it stopped before its first checkpoint, or checkpoint/ was removed"
    raise RunDirError(f"--resume: {path} holds a run but no checkpoint to continue ({why}); start it again "
                      f"with --overwrite")


def _saved_config(path: Path) -> dict:
    """The run's saved config for a message, or {} (through the bounded, alias-free reader)."""
    from minirl.training.config_file import read_config_file

    try:
        return read_config_file(path / "config.yaml")
    except ValueError:
        return {}


def read_manifest(path: str | os.PathLike) -> list[str] | None:
    """The names a run in ``path`` wrote; None when no run is there (no manifest). A damaged
    manifest is refused: guessing would mean deleting files by a guess."""
    file = Path(path) / MANIFEST
    if not file.exists():
        return None
    try:
        files = json.loads(file.read_text())["files"]
        if not (isinstance(files, list) and all(isinstance(f, str) and f and not Path(f).is_absolute()
                                                and ".." not in Path(f).parts for f in files)):
            raise ValueError("'files' must be a list of relative paths inside out_dir")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RunDirError(f"{file} is damaged ({e}); restore it, or set another out_dir") from None
    return files
