"""The layout shows the data flow: imports run down it only, and no module imports itself back through others.

Reads the source with ``ast`` (no third-party tool, nothing imported): every import statement, those inside
functions too, since a function-level import is as much a dependency as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# where each installed package's source lies (pyproject's package-dir)
SOURCES = {"cptsim": ROOT / "cptsim", "cptsim.planner": ROOT / "planner", "cptsim.cli": ROOT / "cli"}

# The declared order, first stage first. A module may import its own stage or an earlier one, never a later.
# cptsim.run.config and the plan file's reader/writer sit before the planner: the planner may know what a run is and
# write the plan a run reads, never the loop that runs it.
# The root package only defines __version__ (and its lazy API names, imported by name on first use).
ORDER = [
    ("base", ["cptsim", "cptsim.errors", "cptsim.fileio"]),
    ("numerics", ["cptsim.numerics"]),
    ("models", ["cptsim.models"]),
    ("data", ["cptsim.data"]),
    ("measure", ["cptsim.measure"]),
    ("cost", ["cptsim.cost"]),
    ("run.config", ["cptsim.run.config", "cptsim.run.planfile"]),
    ("planner", ["cptsim.planner"]),
    ("run", ["cptsim.run"]),
    ("calibration", ["cptsim.calibration"]),
    ("study", ["cptsim.study"]),
    ("cli", ["cptsim.cli"]),
    # DESIGN's API names kept as re-exports for users; nothing in cptsim may import them
    ("public re-exports", ["cptsim.schedules", "cptsim.hardware", "cptsim.profiler"]),
]


def modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package __init__)"""
    found = {}
    for pkg, folder in SOURCES.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            if pkg == "cptsim" and name.split(".")[1:2] in (["planner"], ["cli"]):
                continue  # not there; the installed names map to planner/ and cli/
            found[name] = (f, is_pkg)
    return found


MODULES = modules()


def imports_of(name: str) -> set[str]:
    """The cptsim modules ``name`` imports (``from a import b`` where a.b is a module counts as a.b)."""
    path, is_pkg = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            if t == "cptsim" or t.startswith("cptsim."):
                while t not in MODULES and "." in t:  # an attribute path: its module
                    t = t.rsplit(".", 1)[0]
                out.add(t)
    out.discard(name)
    return out


def stage(module: str) -> int:
    """Index in ORDER of the most specific prefix that names the module."""
    best, best_len = None, -1
    for i, (_label, prefixes) in enumerate(ORDER):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{module} belongs to no stage of tests/test_layout.py's ORDER"
    return best


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_belongs_to_a_declared_stage():
    assert len(MODULES) > 50  # the walk found the package
    for m in MODULES:
        stage(m)


def test_no_import_runs_up_the_flow():
    bad = []
    for m, targets in sorted(GRAPH.items()):
        for t in sorted(targets):
            if stage(t) > stage(m):
                bad.append(f"{m} ({ORDER[stage(m)][0]}) imports {t} ({ORDER[stage(t)][0]})")
    assert not bad, "imports against the flow:\n" + "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert not _cycles(GRAPH), f"import cycles: {_cycles(GRAPH)}"


@pytest.mark.parametrize("graph,expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert _cycles(graph) == expected


def packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the packages (cptsim.run, cptsim.planner, ...: the first two name parts), every
    import counted, those inside functions too: a function-level import hides a cycle from Python, not from here."""
    def pkg(m):
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(pkg(m), set()).update(pkg(t) for t in targets if pkg(t) != pkg(m) and pkg(t) != "cptsim")
    return out


# Package pairs that import each other today, each with why it is not yet undone. Empty is the goal: an entry here
# is a known debt, and a new cycle fails.
KNOWN_PACKAGE_CYCLES: list[list[str]] = []


def test_no_package_imports_another_that_imports_it_back():
    cycles = [c for c in _cycles(packages(GRAPH)) if c not in KNOWN_PACKAGE_CYCLES]
    assert not cycles, f"package cycles (function-level imports included): {cycles}"


def test_a_planted_function_level_package_cycle_is_caught():
    """run/ importing the planner inside a function (as it once did for the plan file) is a cycle between the two
    packages, since the planner imports run.config."""
    planted = dict(GRAPH)
    planted["cptsim.run.api"] = GRAPH["cptsim.run.api"] | {"cptsim.planner.select"}
    assert ["cptsim.planner", "cptsim.run"] in _cycles(packages(planted))


def test_the_checks_catch_a_planted_violation():
    """Guard against a walk that sees nothing: today's quantizer layer asking the model registry would fail."""
    planted = dict(GRAPH)
    planted["cptsim.numerics.layers"] = GRAPH["cptsim.numerics.layers"] | {"cptsim.models"}
    assert stage("cptsim.models") > stage("cptsim.numerics.layers")
    assert "cptsim.numerics.layers" in {m for c in _cycles(planted) for m in c}


def test_every_stage_package_says_what_it_holds_and_may_import():
    for pkg in ("numerics", "models", "data", "measure", "cost", "calibration", "run", "study"):
        doc = ast.get_docstring(ast.parse((ROOT / "cptsim" / pkg / "__init__.py").read_text()))
        assert doc and "import" in doc, f"cptsim/{pkg}/__init__.py needs a docstring saying what it may import"


def test_no_cli_command_module_imports_another():
    """A command's shared helpers live in cli/common.py (or another helper module) or in the library: a command
    module that imports another command's module ties two commands' code together for one helper."""
    bad = [f"{m} imports {t}" for m, targets in sorted(GRAPH.items()) if m.startswith("cptsim.cli.")
           and m.endswith("_cmd") for t in sorted(targets) if t.startswith("cptsim.cli.") and t.endswith("_cmd")]
    assert not bad, "command modules importing each other:\n" + "\n".join(bad)
