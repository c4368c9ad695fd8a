"""tcmalloc under every process the project starts, because glibc's allocator page-faults each RL step.

glibc's ``malloc`` serves any block over its mmap threshold (at most 32 MB) with a fresh ``mmap``
and unmaps it on ``free``, so every large tensor a step allocates (the tied ``[V, H]`` embedding's
gradient and its fp32 cast, the log-prob kernel's ``[chunk, V]`` blocks, AdamW's snapshot) is
zero-filled by the kernel page by page again: 21-34 ms to cast a ``[49152, 576]`` bf16 tensor into a
new fp32 one on this VM, 8 ms into one already touched. tcmalloc keeps freed pages and hands them
back: on smollm2-135m's bf16 collapse step 7.8-8.4 s instead of 10.5-11.5 s
(docs/measurements/2026-12-03-allocator.md). vLLM's CPU install guide asks for the same preload.

The allocator must be chosen before the process starts (``LD_PRELOAD``), so ``mlab`` and
``labs.reproduce`` re-execute themselves once with it (``relaunch``), and the Makefile starts its
Pythons under ``python -m labs.allocator``'s variables. ``MLAB_MALLOC=system`` keeps glibc's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LIBRARY = "libtcmalloc_minimal.so.4"  # Debian/Ubuntu package libtcmalloc-minimal4 (gperftools)
SEARCH = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
QUIET = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}  # no "tcmalloc: large alloc" line per GiB
RELAUNCHED = "MLAB_MALLOC_RELAUNCHED"  # set on the re-executed process: never loop if the preload failed


def library() -> Path | None:
    """The tcmalloc shared library on this machine, or None (then glibc's allocator stays)."""
    return next((Path(d) / LIBRARY for d in SEARCH if (Path(d) / LIBRARY).is_file()), None)


def active() -> bool:
    """Whether this process runs on tcmalloc (it is mapped into the process)."""
    try:
        return "tcmalloc" in Path("/proc/self/maps").read_text()
    except OSError:  # no /proc (macOS): nothing was preloaded by us
        return False


def preload_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that start a process on tcmalloc, on top of ``env`` (default: this process's);
    none when ``MLAB_MALLOC=system`` or the library is absent."""
    env = dict(os.environ if env is None else env)
    lib = library()
    if env.get("MLAB_MALLOC", "tcmalloc") == "system" or lib is None:
        return {}
    preload = env.get("LD_PRELOAD", "")
    if LIBRARY in preload:
        return {}
    return {"LD_PRELOAD": f"{lib}:{preload}" if preload else str(lib), **QUIET}


def relaunch() -> None:
    """Re-execute this process (same interpreter, same command line, ``sys.orig_argv``) on tcmalloc
    when it is not on it yet; returns without doing anything otherwise. Call it first thing in a
    ``main``, before torch allocates anything."""
    extra = preload_env()
    if not extra or active() or os.environ.get(RELAUNCHED):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **extra, RELAUNCHED: "1"})


if __name__ == "__main__":  # the Makefile: `env $$(python -m labs.allocator) python ...`
    print(" ".join(f"{k}={v}" for k, v in preload_env().items()))
