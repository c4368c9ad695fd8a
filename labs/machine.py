"""Which CPU class this box is, which instruction sets its numeric libraries really use, and the cap to AVX2.

Why: the lab's numbers depend on the machine's rounding and speed (OpenBLAS's dot kernel, oneDNN's
bf16 GEMM, numba's vector width, torch's SIMD kernels), and the boxes it runs on range from AVX2-only
laptops and EPYCs to AMX Xeons. A change made on an AMX box must fail there if it would fail on an
AVX2 laptop, so ``make test-avx2`` reruns the numerically sensitive tests with every library capped to
AVX2 (``AVX2_CAP``), and checks *from each library's own report* (``report``) that the cap took
effect: a variable a library ignores would test nothing. docs/machine.md has the table of what each
class gets.

``python -m labs.machine`` prints the report; ``--require avx2`` exits 1 unless every library runs at
AVX2 (the first step of ``make test-avx2``); ``--cap-env avx2`` prints ``AVX2_CAP`` for ``env``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

AVX2_CAP = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own SIMD kernels (torch.backends.cpu.get_cpu_capability)
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's GEMMs and convolutions (its verbose "isa:" line)
    "NUMBA_CPU_NAME": "haswell",  # numba's compile target (the compare kernels)
    "NUMBA_CPU_FEATURES": "",  # with a name, numba takes the named CPU's features, not the host's
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS kernels (its corename)
}
"""The variables that make every numeric library of the lab run as on an AVX2-only CPU."""

CAPPED = {"torch": "AVX2", "onednn": "Intel AVX2", "numba": "haswell", "openblas": "Haswell"}
"""What each library reports under ``AVX2_CAP`` (``report``'s values)."""


def cpu_class(flags: set[str] | None = None) -> str:
    """"AMX", "AVX-512" or "AVX2" (else "other"): the classes whose numerics and speed differ
    here (AMX-BF16 and AVX512-BF16 run bf16 GEMMs natively, AVX2 does not)."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512f" in flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else "other"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), e.g. "AMD EPYC" or "Intel(R) Xeon(R) Platinum 8481C"."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    line = next((ln for ln in text.splitlines() if ln.startswith("model name")), "")
    return line.partition(":")[2].strip() or "unknown"


def report() -> dict[str, str]:
    """The CPU and the instruction set each numeric library uses, each read from the library."""
    return {"cpu": cpu_model(), "class": cpu_class(), "torch": torch_capability(), "onednn": onednn_isa(),
            "numba": numba_cpu(), "openblas": openblas_core()}


def torch_capability() -> str:
    """torch's SIMD dispatch level ("AVX2", "AVX512", "DEFAULT"...), as torch reports it."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def onednn_isa() -> str:
    """oneDNN's ISA, from its verbose "isa:" line. oneDNN prints it (to the C stdout) on its
    first primitive, so a child process runs one and this reads its output."""
    code = ("import torch\nwith torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):\n"
            "    torch.ones(4, 8).to_mkldnn().to_dense()\n")  # a oneDNN reorder, on any thread count
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=os.environ.copy()).stdout
    found = re.search(r"onednn_verbose,(?:v1,)?info,cpu,isa:([^\n]+)", out)
    return found.group(1).strip() if found else "unknown"


def numba_cpu() -> str:
    """The CPU name numba compiles for (NUMBA_CPU_NAME, else the host's)."""
    from numba.core.registry import cpu_target

    return cpu_target.target_context.codegen()._get_host_cpu_name()


def openblas_core() -> str:
    """The OpenBLAS kernel family numpy runs ("Haswell", "SkylakeX", "Zen"...), from the library
    numpy loaded (its ``*get_corename*`` function)."""
    import numpy  # noqa: F401  (loads its OpenBLAS)

    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    libs = sorted({ln.split()[-1] for ln in maps.splitlines() if "openblas" in ln.lower() and ".so" in ln})
    for lib in libs:
        handle = ctypes.CDLL(lib)
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                     "openblas_get_corename"):
            fn = getattr(handle, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return "unknown"


def mismatches_with_cap(found: dict[str, str]) -> list[str]:
    """The libraries whose report is not the AVX2 one (``CAPPED``): the cap did not take there."""
    return [f"{lib}: {found[lib]!r}, expected {want!r}" for lib, want in CAPPED.items() if found[lib] != want]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labs.machine", description=__doc__.split("\n")[0])
    parser.add_argument("--require", choices=["avx2"], help="exit 1 unless every library runs at this ISA")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--cap-env", choices=["avx2"], help="print the cap's variables as K=V words (for env)")
    args = parser.parse_args(argv)
    if args.cap_env:
        print(" ".join(f"{k}={v}" for k, v in AVX2_CAP.items()))
        return 0
    found = report()
    print(json.dumps(found) if args.json else "\n".join(f"{k:>8}: {v}" for k, v in found.items()))
    if args.require:
        missing = mismatches_with_cap(found)
        if missing:
            print("the AVX2 cap did not take effect: " + "; ".join(missing) + ". Set "
                  + " ".join(f"{k}={v}" for k, v in AVX2_CAP.items()) + " before Python starts.", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
