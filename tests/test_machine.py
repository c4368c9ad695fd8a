"""The AVX2 cap takes effect on any box, and the machine report reads each library's own answer.

Why: ``make test-avx2`` is worth something only if every numeric library really runs at AVX2
under ``labs.machine.AVX2_CAP``; a variable a library ignores (or a name it no longer reads)
would make an AMX box pass tests an AVX2 laptop fails. The child process checks each one
from the library's report, on whatever CPU runs the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from labs import machine


def _report(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "labs.machine", "--json"], env=os.environ | env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def test_the_avx2_cap_takes_effect_in_every_library():
    found = _report(machine.AVX2_CAP)
    assert machine.mismatches_with_cap(found) == [], found


def test_require_names_the_library_the_cap_missed():
    """Capping all but torch: ``--require avx2`` exits 1 and names torch and the variable to set."""
    env = os.environ | machine.AVX2_CAP | {"ATEN_CPU_CAPABILITY": "default"}
    done = subprocess.run([sys.executable, "-m", "labs.machine", "--require", "avx2"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "torch: 'DEFAULT'" in done.stderr and "ATEN_CPU_CAPABILITY=avx2" in done.stderr


def test_cap_env_prints_what_env_takes():
    out = subprocess.run([sys.executable, "-m", "labs.machine", "--cap-env", "avx2"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert dict(w.split("=", 1) for w in out) == machine.AVX2_CAP


def test_cpu_class_from_flags():
    assert machine.cpu_class({"avx2", "avx512f", "amx_bf16"}) == "AMX"
    assert machine.cpu_class({"avx2", "avx512f", "avx512_bf16"}) == "AVX-512"
    assert machine.cpu_class({"avx2", "fma"}) == "AVX2"
    assert machine.cpu_class({"sse4_2"}) == "other"
    assert machine.cpu_class() in {"AMX", "AVX-512", "AVX2", "other"}
