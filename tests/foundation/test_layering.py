"""Dependencies point one way: labs -> (aligntools, minirl) -> kernels (DESIGN.md section 2)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def imported_modules(package: str) -> dict[str, set[str]]:
    """file -> top-level-qualified names it imports (absolute imports only)."""
    out = {}
    for path in (REPO / package).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        out[str(path.relative_to(REPO))] = names
    return out


@pytest.mark.parametrize("package, forbidden", [
    ("kernels", ("aligntools", "minirl", "labs", "transformers", "xarray")),
    ("minirl", ("aligntools", "labs")),
    ("aligntools", ("labs", "minirl.engine")),  # minirl only through its public names
])
def test_no_import_against_the_layering(package, forbidden):
    bad = {f: sorted(n for n in names if n.split(".")[0] in forbidden or n.startswith(forbidden))
           for f, names in imported_modules(package).items()}
    assert not {f: n for f, n in bad.items() if n}


def test_importing_aligntools_does_not_import_minirl_or_nnsight():
    code = "import sys, aligntools; print(sorted(m for m in ('minirl', 'nnsight', 'vllm', 'sglang') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
