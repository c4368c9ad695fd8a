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
Only the project's own entry points re-execute (``ENTRY_MODULES``, ``SCRIPTS``): a user's script,
``python -c`` or a script fed on stdin that calls ``labs.cli.main()`` would be replayed from its
first line (its side effects twice; stdin already spent, so nothing at all), so it keeps the
allocator it was started with (docs/rl.md "The allocator").
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

LIBRARY = "libtcmalloc_minimal.so.4"  # Debian/Ubuntu package libtcmalloc-minimal4 (gperftools)
SEARCH = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
QUIET = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}  # no "tcmalloc: large alloc" line per GiB
RELAUNCHED = "MLAB_MALLOC_RELAUNCHED"  # set on the re-executed process: never loop if the preload failed
ENTRY_MODULES = ("labs.cli", "labs.reproduce")  # `python -m` entry points: importing them has no side effect
SCRIPTS = ("mlab",)  # pyproject's console scripts: two lines that import and call labs.cli.main


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


def entry_point() -> bool:
    """Whether ``__main__`` is one of the project's entry points, which can be started again from its
    command line with nothing replayed: ``python -m`` one of ``ENTRY_MODULES``, or a console script of
    ``SCRIPTS`` in this interpreter's scripts folder (not a user's file that happens to share its name)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return spec.name in ENTRY_MODULES
    path = getattr(main, "__file__", None)
    scripts = Path(sysconfig.get_path("scripts"))
    return path is not None and any(Path(path).resolve() == (scripts / name).resolve() for name in SCRIPTS)


def relaunch() -> None:
    """Re-execute this process (same interpreter, same command line, ``sys.orig_argv``) on tcmalloc
    when it is one of the project's entry points (``entry_point``) not on tcmalloc yet; returns
    without doing anything otherwise. Call it first thing in a ``main``, before torch allocates anything."""
    _warn_unknown_opt_out()
    extra = preload_env()
    if not extra or active() or os.environ.get(RELAUNCHED) or not entry_point():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **extra, RELAUNCHED: "1"})


def _warn_unknown_opt_out() -> None:
    """``MLAB_MALLOC=glibc`` reads like an opt-out but is not one: say so (once, not again in the
    re-executed process) instead of ignoring it silently."""
    value = os.environ.get("MLAB_MALLOC", "tcmalloc")
    if value not in ("tcmalloc", "system") and not os.environ.get(RELAUNCHED):
        print(f"labs.allocator: warning: MLAB_MALLOC={value!r} is not understood (only 'system', glibc's "
              "allocator, opts out of tcmalloc); ignored", file=sys.stderr)


if __name__ == "__main__":  # the Makefile: `env $$(python -m labs.allocator) python ...`
    _warn_unknown_opt_out()
    print(" ".join(f"{k}={v}" for k, v in preload_env().items()))
