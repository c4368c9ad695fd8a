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


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:``: an annotation-only import is never
    executed, so it neither layers nor closes a circle (a lazy import inside a function does)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """module -> project modules it imports at run time (anywhere in the file, lazy imports
    included; ``if TYPE_CHECKING:`` blocks excluded)."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
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

def documented_rules() -> list[tuple[str, tuple[str, ...]]]:
    """(importer prefix, forbidden prefixes) from the table in docs/architecture.md: the page is
    the rule, so the page and the test cannot drift apart."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Import rules (enforced)", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    cell = lambda c: tuple(x.strip().strip("`") for x in c.split(","))  # noqa: E731
    return [(cell(a)[0], cell(b)) for a, b in (row.strip("|").split("|") for row in rows)]


RULES = documented_rules()


@pytest.mark.parametrize("importer, forbidden", RULES)
def test_no_import_against_the_layering(importer, forbidden):
    bad = {m: sorted(d for d in deps if d.startswith(forbidden))
           for m, deps in GRAPH.items() if m == importer or m.startswith(importer + ".")}
    assert not {m: d for m, d in bad.items() if d}


def test_the_documented_rules_are_read():
    assert len(RULES) >= 10 and ("minirl", ("aligntools", "labs")) in RULES
    assert ("minirl.training", ("minirl.scale_out", "minirl.driver")) in RULES  # inside minirl too


def test_the_group_sources_never_see_the_trainer():
    """The group sources get ``RolloutInputs`` (engine, tokenizer, problems, verifier), not the
    ``Trainer``: not even an annotation-only import of it."""
    for module in ("groups", "c3po_loop"):
        tree = ast.parse((REPO / "minirl" / "training" / f"{module}.py").read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "Trainer" not in names and "minirl.training.trainer" not in imported, module


def test_the_trainer_reaches_vllm_by_an_import_the_graph_sees():
    """vLLM rollouts are minirl's own (``minirl.vllm``): the one builder (``minirl.engines``)
    imports them, so the rules above see that arrow (it used to hide behind an entry point)."""
    assert {"minirl.vllm.rollouts", "minirl.vllm.llm"} <= GRAPH["minirl.engines"]


def test_engine_entry_points_point_into_minirl_not_back():
    """A third-party ``minirl.engines`` plugin is imported by minirl at run time, so the plugin
    module may depend on minirl but minirl's own modules must never import it back."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    eps = project.get("entry-points", {}).get("minirl.engines", {})
    for name, target in eps.items():
        module = target.split(":")[0]
        assert module in GRAPH, f"entry point {name} -> {module}: no such module"
        importers = {m for m, deps in GRAPH.items() if module in deps and m.startswith("minirl")}
        assert not importers, f"minirl imports its own plugin {module}: {importers}"


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


def test_minirl_modules_do_not_import_through_their_own_front_door():
    """``from minirl import SamplingParams`` inside minirl climbs back up to the package and down
    again (and, lazily resolved, hides the real arrow from this graph): import the defining module."""
    import minirl

    bad = []
    for path in (REPO / "minirl").rglob("*.py"):
        if path == REPO / "minirl" / "__init__.py":
            continue
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "minirl" and not node.level:
                bad += [f"{path.relative_to(REPO)}: {a.name}" for a in node.names if a.name in minirl.__all__]
    assert not bad
