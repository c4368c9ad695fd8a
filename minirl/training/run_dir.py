"""The run directory: what a run owns in ``out_dir``, and one run at a time there.

A run never deletes or overwrites a file it did not write. So that it can tell, it keeps a
*manifest*, ``.mlab-run.json``: the names it writes, added before each is first written, and,
when the run ends, a stamp (size, mtime, inode) of each file it left. A directory *holds a run*
only if it has a manifest; ``--overwrite`` removes the manifest's entries and leaves everything
else (named in a note). A directory without a manifest whose files would collide with the run's
(``config.yaml``, ``metrics.nc``, ...) is refused: they are someone else's, and the fix is another
``out_dir``, never deleting them.

The manifest is data anyone can edit, so ``--overwrite`` trusts it only as far as it can check:
every entry must be a name a run writes (``RUN_NAMES``), reached without crossing a symlink, and
every entry is checked before any is removed. Removal walks directory file descriptors opened
with ``O_NOFOLLOW``, so a directory swapped for a link never leads a removal out of ``out_dir``.
A file changed since its stamp may not be the run's any more: it is kept and named when no new
run writes that name (a TensorBoard event file), and the overwrite is refused when one would
(``config.yaml``: keeping it would only mean the new run replaces it a moment later).

One run per directory: ``.mlab-run.lock`` is held with ``flock`` for the whole run and holds the
holder's pid. The kernel drops the lock when its process ends, ``kill -9`` included, so a crashed
run never blocks the next; and it needs no HDF5 file locking (often off on NFS/Lustre,
``HDF5_USE_FILE_LOCKING=FALSE``), which is what used to decide, half-way through, which of two
runs died. The lock must be a regular file, opened without following a link and without
blocking (a FIFO), and is truncated only once it is held: a link planted there never makes a
run write through it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from minirl.output_paths import describe_mode

MANIFEST = ".mlab-run.json"
LOCK = ".mlab-run.lock"
LOCK_WAIT_S = 0.5
"""How long a held lock is retried before the run holding it is named: a check looks for an instant."""
OWNED = ("config.yaml", "metrics.nc", ".metrics.nc.tmp", "checkpoint", ".checkpoint.old", "curves.png")
"""what every run writes at the top of ``out_dir`` (``tensorboard/`` holds only the event files it lists)."""
CHECKPOINTS = ("checkpoint", ".checkpoint.old")
"""the entries that are directories; a new run's first save replaces them whole."""
CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "optimizer.json", "rng.safetensors", "state.json")
"""what ``minirl.training.checkpointing.save`` writes into a checkpoint directory (were it to write
another, a real run's ``--overwrite`` would be refused: ``tests/minirl/training/test_run_dir.py``)."""
EVENTS = "tensorboard/events.out.tfevents."
"""the prefix of the TensorBoard event files a run lists one by one."""
ROLLOUTS = "rollouts/"
"""``record_rollouts``' folder: ``step-NNNNNN.jsonl`` per step, each written via ``.step.jsonl.tmp``
(``minirl.training.rollout_records``), every name claimed before it is written."""
_ROLLOUT_STEP = re.compile(r"rollouts/step-\d{6,}\.jsonl")
_FIXED_NAMES = (*OWNED, "monitor.png", f"{ROLLOUTS}.step.jsonl.tmp")
RUN_NAMES = (*_FIXED_NAMES, f"{EVENTS}*", f"{ROLLOUTS}step-*.jsonl")
"""every name a run writes; a manifest entry outside these is no run's, so the manifest is damaged."""
MAX_MANIFEST_BYTES = 1 << 20
"""as the config reader's cap: a run's manifest is a few hundred bytes; a huge one is no run's."""

_PID = re.compile(rb"(\d{1,10})\n?")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
Stamp = tuple[int, int, int]
"""(size, mtime_ns, inode) of a file as the run left it."""


class RunDirError(ValueError):
    """``out_dir`` cannot take this run; the message says why and what to do."""


@dataclass
class Manifest:
    """A run's manifest: its entries, and the stamps of its files when it ended (none while it
    runs, or if it was killed: then its entries are removed by name alone)."""

    files: list[str] = field(default_factory=list)
    stamps: dict[str, Stamp] = field(default_factory=dict)


class RunDir:
    """``out_dir``, locked for one run. ``open`` checks and locks; ``start`` clears the previous
    run (a fresh start) and writes the manifest; ``claim`` adds a name before it is written;
    ``close`` stamps what the run left and releases the lock."""

    def __init__(self, out_dir: str | os.PathLike, fd: int) -> None:
        self.path, self._fd = Path(out_dir), fd
        self._previous = _load(self.path)
        self.entries: list[str] = list(self._previous.files) if self._previous else []
        self._live = False  # this run writes here: stamp its files on close

    @classmethod
    def open(cls, out_dir: str | os.PathLike, resume: bool, overwrite: bool = True) -> "RunDir":
        """Check that ``out_dir`` can take this run (``check``), then lock it; refused by name
        when another run holds it, before any file changes."""
        check(out_dir, resume, overwrite)
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        fd = _take_lock(path)
        try:
            _check_contents(path, resume, overwrite)  # again under the lock: the holder may have changed it
            run = cls(path, fd)
        except BaseException:
            os.close(fd)
            raise
        if resume:  # its files change from now on: their stamps would be stale if this run is killed
            run._live = True
            run._write({})
        return run

    def start(self) -> list[str]:
        """A fresh run: remove the previous run's entries (all checked first), start a new
        manifest; -> what a replaced run's directory keeps: the names of the files it did not
        write, and its own files changed since it wrote them, with why; [] when there was none."""
        kept: list[str] = []
        if self._previous is not None:
            removal = _plan(self.path, self._previous)
            removal.execute(self.path)
            kept = [f"{name} ({why})" for name, why in removal.kept]
        self.entries, self._live = [], True
        self.claim(*OWNED)
        if self._previous is None:
            return []
        others = sorted(p.name for p in self.path.iterdir() if p.name not in (*OWNED, MANIFEST, LOCK))
        return others + kept

    def claim(self, *names: str) -> None:
        """Record ``names`` (relative to ``out_dir``) as the run's, before they are written."""
        for name in names:
            if (why := _why_not_run_name(name)) is not None:
                raise ValueError(f"a run cannot claim {name!r}: {why}; add it to RUN_NAMES first")
        new = [n for n in dict.fromkeys(names) if n not in self.entries]
        if new:
            self.entries += new
            self._write({})

    def close(self) -> None:
        """Stamp the files this run left, then release the lock (the lock file stays: removing
        it would race with the next run)."""
        if self._fd < 0:
            return
        try:
            if self._live:
                self._write(_stamps(self.path, self.entries))
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1

    def _write(self, stamps: dict[str, Stamp]) -> None:
        body = {"version": 2, "files": self.entries, "stamps": {k: list(v) for k, v in stamps.items()}}
        tmp = self.path / f"{MANIFEST}.tmp"
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, self.path / MANIFEST)


def check(out_dir: str | os.PathLike, resume: bool, overwrite: bool) -> None:
    """Refuse (``RunDirError``) what ``out_dir`` cannot take, before anything loads: a run there
    and neither ``resume`` nor ``overwrite``; ``resume`` with no run or no checkpoint; files of
    someone else's where the run would write; an overwrite that would remove or replace what is
    not the run's (``start`` removes only after this holds). A run holding ``out_dir`` is named first,
    whatever else holds. (``out_dir: ''`` is refused with the config.)"""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"out_dir {out_dir} is a file, not a directory; set another out_dir")
    _refuse_if_in_use(path)
    _check_contents(path, resume, overwrite)


def _check_contents(path: Path, resume: bool, overwrite: bool) -> None:
    """``check`` of what ``path`` holds (``RunDir.open`` asks again once it holds the lock)."""
    manifest = _load(path)
    if manifest is None:
        if resume:
            raise RunDirError(f"--resume: {path} holds no run (no {MANIFEST}), so there is nothing to resume; "
                              f"drop --resume to start a new run")
        foreign = sorted(n for n in OWNED if (path / n).exists() or (path / n).is_symlink())
        if foreign:
            raise RunDirError(f"out_dir {path} has files no run wrote there ({', '.join(foreign)}; no {MANIFEST}); "
                              f"a run would overwrite them: set another out_dir")
        return
    if resume:
        _check_checkpoint(path)
    elif not overwrite:
        present = ", ".join(n for n in manifest.files if (path / n).exists())
        raise RunDirError(f"out_dir {path} already holds a run ({present}); continue it with --resume, replace "
                          f"it with --overwrite (only the run's own files), or set another out_dir")
    else:
        _plan(path, manifest)


def _check_checkpoint(path: Path) -> None:
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


# ---------------------------------------------------------------------------- the manifest
def read_manifest(path: str | os.PathLike) -> list[str] | None:
    """The names a run in ``path`` wrote; None when no run is there (no manifest). A damaged
    manifest is refused: guessing would mean deleting files by a guess."""
    manifest = _load(Path(path))
    return None if manifest is None else manifest.files


def _load(path: Path) -> Manifest | None:
    """``path``'s manifest, every entry checked (``_why_not_run_name``); None when there is none.
    A manifest from before stamps (``{"files": [...]}``) reads as a run killed before its end:
    its entries are removed by name, which the name check keeps to what a run writes."""
    file = path / MANIFEST
    try:
        mode = os.lstat(file).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(mode):
        raise RunDirError(f"{file} is {describe_mode(mode)}, not the manifest a run writes (a regular file); "
                          f"remove it if it is yours, or set another out_dir")
    try:
        raw = _read_capped(file)
        body = json.loads(raw)
        if not isinstance(body, dict) or not isinstance(body.get("files"), list):
            raise ValueError("expected a JSON object with a list 'files'")
        if not all(isinstance(f, str) for f in body["files"]):
            raise ValueError("every entry of 'files' must be a string")
        files = list(dict.fromkeys(body["files"]))
        for name in files:
            if (why := _why_not_run_name(name)) is not None:
                raise ValueError(f"entry {name!r} {why}")
        stamps = body.get("stamps", {})
        if not (isinstance(stamps, dict) and all(_is_stamp(v) for v in stamps.values())):
            raise ValueError("'stamps' must map names to [size, mtime_ns, inode]")
    except (OSError, ValueError, TypeError) as e:
        raise RunDirError(f"{file} is damaged ({e}); nothing was removed. Restore it, or set another "
                          f"out_dir") from None
    return Manifest(files, {k: tuple(v) for k, v in stamps.items()})


def _read_capped(file: Path) -> bytes:
    """The manifest's bytes, opened without following a link or blocking, at most ``MAX_MANIFEST_BYTES``."""
    fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"it is {describe_mode(st.st_mode)}, not a regular file")
        if st.st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{st.st_size:,} bytes; a run's manifest is under {MAX_MANIFEST_BYTES:,}")
        raw = os.read(fd, MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValueError(f"over {MAX_MANIFEST_BYTES:,} bytes; a run's manifest is a few hundred")
    return raw


def _is_stamp(value: object) -> bool:
    return (isinstance(value, list) and len(value) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value))


def _why_not_run_name(name: str) -> str | None:
    """None when a run writes ``name`` (``RUN_NAMES``), else why it is no run's: spelled exactly,
    so ``.``, ``x/.``, ``' config.yaml'``, an absolute path or ``..`` never match."""
    if name in _FIXED_NAMES or _ROLLOUT_STEP.fullmatch(name):
        return None
    tail = name[len(EVENTS):] if name.startswith(EVENTS) else ""
    if tail and "/" not in tail and "\0" not in tail and tail.strip() == tail and len(EVENTS + tail) <= 12 + 255:
        return None  # 255: the longest file name a file system takes (after "tensorboard/")
    if name.startswith("/") or ".." in name.split("/"):
        return "leads outside out_dir"
    return f"is not a name a run writes ({', '.join(RUN_NAMES)})"


# ---------------------------------------------------------------------------- stamps and removal
def _walk(root: int, rel: str) -> tuple[int, str]:
    """(a new fd of ``rel``'s directory, its last part), each directory opened without following
    a link: a symlink on the way raises (ELOOP or ENOTDIR), never leads elsewhere."""
    *dirs, last = rel.split("/")
    fd = os.dup(root)
    try:
        for part in dirs:
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, last


def _lstat(root: int, rel: str) -> os.stat_result | None:
    """``rel``'s own status (a link's, not its target's), None when it is missing; a link or a
    file on the way raises ``OSError``."""
    try:
        fd, last = _walk(root, rel)
    except FileNotFoundError:
        return None
    try:
        return os.stat(last, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def _files_under(root: int, entries: list[str]) -> list[str]:
    """The files of ``entries`` as stamps name them: a checkpoint directory by the files in it."""
    out = []
    for name in entries:
        try:
            st = _lstat(root, name)
        except OSError:  # reached through a link: no file of the run's (``_plan`` refuses it by name)
            continue
        if st is not None and name in CHECKPOINTS and stat.S_ISDIR(st.st_mode):
            fd = os.open(name, _DIR_FLAGS, dir_fd=root)
            try:
                out += [f"{name}/{inner}" for inner in sorted(os.listdir(fd))]
            finally:
                os.close(fd)
        elif st is not None:
            out.append(name)
    return out


def _stamps(path: Path, entries: list[str]) -> dict[str, Stamp]:
    """The stamp of each regular file the run left (a checkpoint by its files)."""
    root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        stamps = {}
        for rel in _files_under(root, entries):
            st = _lstat(root, rel)
            if st is not None and stat.S_ISREG(st.st_mode):
                stamps[rel] = (st.st_size, st.st_mtime_ns, st.st_ino)
        return stamps
    finally:
        os.close(root)


@dataclass
class _Removal:
    """What ``--overwrite`` removes, worked out (and refused) before anything is removed."""

    files: list[tuple[str, int]] = field(default_factory=list)  # (entry, inode): unlinked in order
    dirs: list[str] = field(default_factory=list)  # removed after their files, when left empty
    kept: list[tuple[str, str]] = field(default_factory=list)  # (entry, why)

    def execute(self, path: Path) -> None:
        """Unlink each planned file through directory fds, if it is still the one planned; then
        ``rmdir`` each planned directory left empty (``rmdir`` of a link fails: never removed)."""
        root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for rel, ino in self.files:
                fd, last = _walk(root, rel)
                try:
                    if os.stat(last, dir_fd=fd, follow_symlinks=False).st_ino != ino:
                        raise RunDirError(f"{path / rel} was replaced while the previous run was being removed; "
                                          f"it was kept. Check out_dir and run again")
                    os.unlink(last, dir_fd=fd)
                finally:
                    os.close(fd)
            for rel in self.dirs:
                try:
                    inner = os.open(rel, _DIR_FLAGS, dir_fd=root)
                except OSError:  # gone, or a link now: nothing to remove
                    continue
                try:
                    empty = not os.listdir(inner)
                finally:
                    os.close(inner)
                if empty:
                    os.rmdir(rel, dir_fd=root)
        finally:
            os.close(root)


def _plan(path: Path, manifest: Manifest) -> _Removal:
    """Check every entry of ``manifest`` against ``path`` and say what removing the run means;
    ``RunDirError`` (nothing removed) for an entry that leads through a link, is not what a run
    leaves (a directory where it writes a file, a device), holds files no run writes, or changed
    since its stamp where a new run writes that name."""
    removal = _Removal()
    root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in manifest.files:
            try:
                st = _lstat(root, name)
            except OSError:
                raise _refusal(path, name, f"{path / name.split('/')[0]} is {_kind(path / name.split('/')[0])}, "
                                           f"and a run's files are never reached through one") from None
            if st is None:
                continue
            if name in CHECKPOINTS and stat.S_ISDIR(st.st_mode):
                _plan_checkpoint(path, root, name, manifest, removal)
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                why = _changed(name, st, manifest)
                if why is None:
                    removal.files.append((name, st.st_ino))
                elif name.startswith(EVENTS):
                    removal.kept.append((name, why))
                else:
                    raise _refusal(path, name, f"it {why}, so it may not be the run's any more, and a new run "
                                               f"writes {name}")
            else:
                raise _refusal(path, name, f"it is {describe_mode(st.st_mode)}, not what a run leaves there")
            folder = name.rpartition("/")[0]  # tensorboard/ or rollouts/: removed once left empty
            if folder and folder not in removal.dirs:
                removal.dirs.append(folder)
    finally:
        os.close(root)
    return removal


def _plan_checkpoint(path: Path, root: int, name: str, manifest: Manifest, removal: _Removal) -> None:
    """A checkpoint directory goes whole (its files, then it): a new run's first save would
    replace it whole, so one that holds anything else is refused rather than kept."""
    for rel in _files_under(root, [name]):
        st = _lstat(root, rel)
        if st is None:
            continue
        if rel.split("/")[1] not in CHECKPOINT_FILES or not stat.S_ISREG(st.st_mode):
            raise _refusal(path, rel, f"a checkpoint holds only {', '.join(CHECKPOINT_FILES)} (regular files), "
                                      f"and a new run's first checkpoint replaces {name}/ whole")
        if (why := _changed(rel, st, manifest)) is not None:
            raise _refusal(path, rel, f"it {why}, so it may not be the run's any more, and a new run's first "
                                      f"checkpoint replaces {name}/ whole")
        removal.files.append((rel, st.st_ino))
    removal.dirs.append(name)


def _changed(rel: str, st: os.stat_result, manifest: Manifest) -> str | None:
    """Why ``rel`` is not the file the run left, None when it is (or the run left no stamps). A
    file with the stamp's size and mtime under another inode is a copy that kept its times
    (``cp -a``, ``rsync -a``, a copied run directory): still the run's."""
    if not manifest.stamps:
        return None
    stamp = manifest.stamps.get(rel)
    if stamp is None:
        return "appeared after the run ended"
    if stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == stamp[:2]:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_ino != stamp[2]:
        return "was replaced since the run ended"
    return "changed since the run wrote it"


def _kind(p: Path) -> str:
    try:
        return describe_mode(os.lstat(p).st_mode)
    except OSError as e:
        return f"unreadable ({e.strerror})"


def _refusal(path: Path, rel: str, why: str) -> RunDirError:
    return RunDirError(f"--overwrite: {path / rel}: {why}. Nothing was removed; move it out of {path} (or remove "
                       f"it yourself), or set another out_dir")


# ---------------------------------------------------------------------------- the lock
def _take_lock(path: Path) -> int:
    """``path``'s lock, held: an fd of the regular file ``.mlab-run.lock`` under ``flock``, now
    holding this pid. Anything else there (a link, a FIFO, a socket, a device, a directory) is
    refused at once, before it is opened through or written; the file is truncated only once held."""
    fd = _open_lock(path)
    try:
        _flock(fd, path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_if_in_use(path: Path) -> None:
    """``check``'s first question: is another run holding ``path``'s lock? Asked before what the
    directory holds, since a live run's files would otherwise be met with "use --resume or
    --overwrite", which is no answer while that run writes them. The lock is taken for an
    instant and dropped (``_flock`` waits out such instants); nothing is created."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # no lock (a first run), or a link: ``_take_lock`` names what it is
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device: ``_take_lock`` refuses it by name
            _flock(fd, path)
    finally:
        os.close(fd)  # drops the flock


def _open_lock(path: Path) -> int:
    """An fd of ``path``'s lock file (created if need be), opened without following a link or blocking
    on a FIFO; refused by name unless it is a regular file."""
    lock = path / LOCK
    try:
        mode = os.lstat(lock).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):
        raise _not_a_lock(lock, mode)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:  # replaced since the lstat (ELOOP: a link now)
        raise RunDirError(f"cannot open the run lock {lock}: {e.strerror}; if it is not a regular file, "
                          f"remove it and start again") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_a_lock(lock, mode)
    return fd


def _flock(fd: int, path: Path) -> None:
    """Hold ``fd``'s lock, or refuse naming the run that holds it. A holder that lets go within
    ``LOCK_WAIT_S`` is another start's ``_refuse_if_in_use`` looking, not a run: waited out."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise RunDirError(f"out_dir {path} is in use by another run ({_holder(fd)}, holding {path / LOCK}); "
                                  f"wait for it to finish, or set another out_dir") from None
            time.sleep(0.01)


def _holder(fd: int) -> str:
    """"pid N" of the lock's holder, read only when the lock holds a pid: a holder writes it just
    after taking the lock, so an empty lock gets 0.5 s to show it (a loaded machine may pause the
    holder between the two)."""
    for _ in range(50):
        if held := _PID.fullmatch(os.pread(fd, 16, 0)):
            return f"pid {held[1].decode()}"
        time.sleep(0.01)
    return "pid unknown: the lock holds no pid"


def _not_a_lock(lock: Path, mode: int) -> RunDirError:
    return RunDirError(f"the run lock {lock} is {describe_mode(mode)}, not the regular file a run makes; no run "
                       f"uses it as it is: remove it (rm {lock}) and start again")
