"""The few wheels the check needs that a lent card lacks: downloaded here, installed there.

A lent card has python3 3.12 with torch, triton, transformers (and what they depend on), numpy,
pandas, xarray, h5py, numba, matplotlib, safetensors, pytest and pytest-benchmark, and no network.
``CARRIED`` is what the dry run imports beyond that (``tests/test_gpu_check.py`` keeps the list
honest against the dry run's own import record), at the versions ``requirements.txt`` pins;
``ANCHORS`` are the kernels stage's reference implementations, pinned here (the lab does not use
them, so ``requirements.txt`` does not list them).

    python -m benchmarks.gpu_check.wheels DIR     # download into DIR (``make gpu-wheels``)

The same folder carries the zoo's tiny MoE and the RL arms' SFT-warmed 16-layer MoE, built here
with the card's transformers (``zoo_dir``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: What the card has, by distribution name (their own dependencies come along; see card_closure).
CARD = ("torch", "triton", "transformers", "numpy", "pandas", "xarray", "h5py", "numba", "matplotlib",
        "safetensors", "pytest", "pytest-benchmark")
CARRIED = ("h5netcdf", "pytest-timeout")
#: Liger-Kernel's and Apple's Cut Cross-Entropy's fused linear cross-entropy: pure-Python wheels
#: (Triton kernels, compiled on the card) that the kernels stage measures the fused logprobs against.
ANCHORS = ("liger-kernel==0.8.5", "cut-cross-entropy==25.1.1")
#: The card's transformers and the hub it needs: a zoo checkpoint records the transformers version
#: that built it and is rebuilt under any other, so the carried zoo is built with these.
CARD_TRANSFORMERS = ("transformers==5.17.0", "huggingface-hub>=1.5,<2")
LIMIT_MIB = 64


def pins(names: tuple[str, ...] = CARRIED, requirements: Path = REPO / "requirements.txt") -> list[str]:
    """``name==version`` for each name, as ``requirements.txt`` pins it."""
    pinned = {}
    for line in requirements.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pinned[_norm(name)] = f"{name}=={version}"
    missing = [n for n in names if _norm(n) not in pinned]
    if missing:
        raise ValueError(f"{missing} not pinned in {requirements}; pin them there so the card gets the tested version")
    return [pinned[_norm(n)] for n in names]


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def download(dest: Path) -> None:
    """Download the carried wheels (pure Python, for CPython 3.12) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                    "--python-version", "3.12", "--no-deps", "-d", str(dest), *pins(), *ANCHORS], check=True)


def carried_names() -> set[str]:
    """Every distribution that travels as a wheel, by normalised name."""
    return {_norm(n) for n in CARRIED} | {_norm(a.partition("==")[0]) for a in ANCHORS}


def build_card_zoo(dest: Path) -> None:
    """Build the card's zoo with the card's transformers into ``dest`` (``zoo_dir``; see
    ``card_zoo``), so the card reuses it instead of training in its few minutes."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", tmp,
                        *CARD_TRANSFORMERS], check=True)
        code = "import sys; from benchmarks.gpu_check.wheels import card_zoo; card_zoo(sys.argv[1])"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(REPO)])}
        subprocess.run([sys.executable, "-c", code, str(dest)], env=env, check=True)


def card_zoo(dest: str | os.PathLike) -> None:
    """(Run under the card's transformers.) The card plan's zoo models that need no GGUF, and the
    RL arms' SFT-warmed model without the base it was warmed from (both would not fit)."""
    import shutil

    from benchmarks.gpu_check.plan import gpu_plan
    from benchmarks.gpu_check.rl_stage import rl_checkpoint
    from labs import zoo

    plan, root = gpu_plan(), Path(dest)
    for name in plan.zoo_models:
        if not zoo.SPECS[name].gguf:
            zoo.build(name, out=root / f"{name}-seed0", progress=False)
    rl_checkpoint(root, plan.gpu_rl)
    if plan.gpu_rl["model"] not in plan.zoo_models:
        shutil.rmtree(root / f"{plan.gpu_rl['model']}-seed0")


def zoo_dir(wheels: Path) -> Path:
    """Where the carried zoo lies inside the wheel folder (the check's MLAB_ZOO_DIR on the card)."""
    return wheels / "zoo"


def size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def install(src: Path) -> Path | None:
    """Install the wheels in ``src`` into a fresh temporary folder (no index, no dependencies) and
    return it, for ``sys.path``/``PYTHONPATH``; None when ``src`` holds no wheels. Without pip, a
    pure-Python wheel installs by unzipping (that is what a wheel is)."""
    found = sorted(src.glob("*.whl"))
    if not found:
        return None
    target = Path(tempfile.mkdtemp(prefix="gpu-check-wheels-"))
    if _has_pip():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(src),
                        "--no-deps", "--target", str(target), *map(str, found)], check=True)
    else:
        for wheel in found:
            zipfile.ZipFile(wheel).extractall(target)
    return target


def _has_pip() -> bool:
    """Whether this interpreter has pip, asked of the installed metadata: ``find_spec("pip")``
    would trip setuptools' distutils shim, which turns itself off for the whole process once pip
    is looked up (every later ``import setuptools``, e.g. vLLM's via torch, then fails)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("pip")
    except PackageNotFoundError:
        return False
    return True


def card_closure() -> set[str]:
    """``CARD`` and everything they require, read from this environment's metadata (the card's
    versions may differ, their dependency names rarely do)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [_norm(n) for n in CARD]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for req in map(Requirement, reqs):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_norm(req.name))
    return seen


def main(folder: Path) -> None:
    """``make gpu-wheels``: the carried wheels and anchors, and the card's zoo, built for the card."""
    download(folder)
    build_card_zoo(zoo_dir(folder))
    total = size_mib(folder)
    built = sorted(p.name for p in zoo_dir(folder).iterdir())
    print(f"{folder}: {len(list(folder.glob('*.whl')))} wheels + zoo {built}, {total:.2f} MiB "
          f"(a lent card takes {LIMIT_MIB} MiB)")
    if total > LIMIT_MIB:
        raise SystemExit(f"{folder} holds {total:.1f} MiB; a lent card takes {LIMIT_MIB} MiB at most")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
