"""The import graph: dependencies point one way (labs -> (aligntools, minirl) -> kernels), the
concepts inside aligntools layer cleanly (viz reads the analyzer, never the reverse), engine
layers never import an architecture, and no module takes part in an import circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("aligntools", "minirl", "kernels", "labs")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> project modules it imports (anywhere in the file, lazy imports included)."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                deps.add(base)
                deps |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import submodule`
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


GRAPH = import_graph()

RULES = [  # (importer prefix, forbidden prefixes)
    ("kernels", ("aligntools", "minirl", "labs")),
    ("minirl", ("aligntools", "labs")),
    ("aligntools", ("labs", "minirl.engine")),  # minirl only through its public names
    ("aligntools.tracker", ("aligntools.analyzer", "aligntools.replayer", "aligntools.gates", "aligntools.viz",
                            "aligntools.cli")),
    ("aligntools.adapters", ("aligntools.analyzer", "aligntools.replayer", "aligntools.gates", "aligntools.viz",
                             "aligntools.cli")),
    ("aligntools.analyzer", ("aligntools.viz", "aligntools.replayer", "aligntools.gates", "aligntools.cli",
                             "aligntools.adapters")),
    ("aligntools.viz", ("aligntools.gates", "aligntools.replayer", "aligntools.cli")),
    ("aligntools.sites", ("aligntools.",)),
    ("minirl.engine.config", ("minirl.engine.archs",)),
    ("minirl.engine.weight_map", ("minirl.engine.archs",)),
]


@pytest.mark.parametrize("importer, forbidden", RULES)
def test_no_import_against_the_layering(importer, forbidden):
    bad = {m: sorted(d for d in deps if d.startswith(forbidden))
           for m, deps in GRAPH.items() if m == importer or m.startswith(importer + ".")}
    assert not {m: d for m, d in bad.items() if d}


def test_no_import_circles():
    """Strongly connected components of the module graph (package __init__ re-exports aside)."""
    graph = {m: {d for d in deps if not GRAPH.get(d) or not m.startswith(d + ".")} for m, deps in GRAPH.items()}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles


def test_importing_aligntools_does_not_import_minirl_or_nnsight():
    code = "import sys, aligntools; print(sorted(m for m in ('minirl', 'nnsight', 'vllm', 'sglang') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_no_public_name_shadows_a_submodule():
    """``import aligntools.x`` must never rebind a public ``aligntools.x`` function."""
    import importlib

    for pkg in ("aligntools", "aligntools.tracker", "aligntools.analyzer", "aligntools.replayer",
                "aligntools.gates", "aligntools.viz", "minirl"):
        mod = importlib.import_module(pkg)
        subs = {p.stem for p in Path(mod.__file__).parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
        assert not set(mod.__all__) & subs, pkg
