"""Shared test harness: markers, GPU auto-skip, zoo fixture, offline + interpreter env."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Set before anything imports transformers or triton.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# One OpenMP thread in every process the tests start too (notebook kernels, `mlab` subprocesses, the
# GPU check's stage workers): with two xdist workers on two cores, a 2-thread child spins against the
# other worker (notebook 05 took 114 s in the suite at its small size, 53 s alone at its default size).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's cache stays in the real TMPDIR, not in the per-session one below (torch names it after
# TMPDIR): a second `make test` reuses the compiled kernels instead of compiling them again.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_uid{os.getuid()}"))

import pytest  # noqa: E402
import torch  # noqa: E402

# One intra-op thread per test process. The models are tiny (a second thread buys little), and
# the suite runs Ray actors, notebook kernels and (under pytest-xdist) one worker per core beside
# it: two OpenMP threads per process on 2 shared cores spin against each other (a 3-step zoo
# build: 0.95 s with one thread, 10.7 s with two on a loaded box). test_crash_safety.py already
# set this at import, so a full run had it; set here it no longer depends on what was collected.
torch.set_num_threads(1)

if not torch.cuda.is_available():
    # Triton kernels run through the interpreter on CPU tensors (docs/machine.md).
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent


FIRST = ("tests/minirl/scale_out/test_ray_mode.py", "tests/minirl/scale_out/test_ray_lifecycle.py",
         "tests/test_notebooks.py", "tests/test_gpu_check.py")
"""The longest-running files, collected first so that the two xdist workers finish together (longest
job first); measured with ``--durations`` in docs/measurements/2026-11-26-make-test.md (the Ray
lifecycle file, ~100 s for its two tests on 2026-12-02, was collected in place and could start last)."""
SPREAD = "tests/test_notebooks.py::test_notebook_executes["
"""Tests that xdist may place one by one: each notebook run is independent, and together they take
as long as the rest of a worker's share."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(FIRST)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``make test``'s scheduler: a file's tests stay on one worker (its module-scoped fixtures, such
    as the Ray cluster or the GPU check's dry run, are built once), except ``SPREAD``, which go one
    by one; units are handed out in collection order (``--no-loadscope-reorder``). xdist's own
    ``--dist loadgroup`` would do this with marks, but pytest 9.2 ignores the node id it rewrites."""
    from xdist.scheduler import LoadScopeScheduling

    class FilesWithNotebooksSpread(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith(SPREAD) else nodeid.split("::", 1)[0]

    return FilesWithNotebooksSpread(config, log)


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(request: pytest.FixtureRequest):
    """One short TMPDIR per test process, for everything the tests start: the notebooks' and labs'
    ``mkdtemp`` folders, vLLM's and Ray's files land in it, and a passing session removes it. Left in
    /tmp they added ~48 MB per run, never removed (docs/measurements/2026-12-08-make-test.md). Short (``/tmp/mlab-tests-XXXX``), not under
    pytest's base directory: Ray and vLLM put Unix sockets in it, whose paths may not pass 107 bytes."""
    path = tempfile.mkdtemp(prefix="mlab-tests-")
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = path
    yield Path(path)
    if before[0] is None:
        os.environ.pop("TMPDIR")
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]
    if request.session.testsfailed == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def zoo_root() -> Path:
    """Where zoo checkpoints live for the test session (reused across runs in the repo)."""
    root = Path(os.environ.get("MLAB_ZOO_DIR", REPO / ".zoo"))
    os.environ["MLAB_ZOO_DIR"] = str(root)
    return root


@pytest.fixture(scope="session")
def zoo(zoo_root: Path):
    """``zoo(name, seed=0) -> Path``: build (once, cached) and return a zoo checkpoint. Under
    pytest-xdist two workers may ask for the same model on a cold cache: ``labs.zoo.build``'s
    file lock makes the second wait for the first's checkpoint."""
    from labs import zoo as zoo_mod

    def get(name: str, seed: int = 0) -> Path:
        return zoo_mod.build(name, out=zoo_root / f"{name}-seed{seed}", seed=seed)

    return get
