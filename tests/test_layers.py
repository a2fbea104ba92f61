"""The layer rule, checked on every module's imports (parsed, not executed).

    core         t10c, t10c.ir, t10c.dtypes, t10c.chips, t10c.costs, and the other shared
                 tables at the top of t10c/ (every t10c/*.py that is not application code):
                 imports no stage and no application module
    stages       t10c.frontend, t10c.partition, t10c.codegen, t10c.emulator, t10c.models:
                 import the core, themselves, and the stages listed in STAGE_IMPORTS
    application  cli, driver, compare, report, planfile, check, explain, meshcompare, ...:
                 on top, may import anything

and no import cycles among modules. Imports made only for type checking (``if
TYPE_CHECKING:``) are left out; imports inside functions count (they run too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
#: package -> its folder (pyproject.toml's package-dir)
PACKAGES = {"t10c": "t10c", "t10c.frontend": "frontend", "t10c.partition": "partition",
            "t10c.codegen": "codegen", "t10c.emulator": "emulator", "t10c.models": "models"}
STAGES = ("t10c.frontend", "t10c.partition", "t10c.codegen", "t10c.emulator", "t10c.models")
#: what each stage may import from other stages: codegen lowers plans; the emulator runs
#: codegen's program types (and only those)
STAGE_IMPORTS: dict[str, tuple[str, ...]] = {
    "t10c.frontend": (), "t10c.partition": (), "t10c.codegen": ("t10c.partition",),
    "t10c.emulator": ("t10c.codegen.program",), "t10c.models": ()}
#: the application: the top-level modules of t10c/ that drive the stages
APPLICATION = ("t10c.cli", "t10c.driver", "t10c.rundir", "t10c.compare", "t10c.report",
               "t10c.planfile", "t10c.check", "t10c.explain", "t10c.meshcompare", "t10c.args",
               "t10c.strategies", "t10c.outputs", "t10c.progress", "t10c.sweep")


def modules() -> dict[str, Path]:
    """Every module of the project, by dotted name."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports at run time (``from pkg import sub`` counts as
    importing the submodule ``pkg.sub`` when there is one, else ``pkg``)."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out = set()
    for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        for target in targets:
            while target and target not in known:  # `import t10c.x.y` of a name in x
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> nx.DiGraph:
    found = modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(found)
    for name, path in found.items():
        for target in imports(name, path, set(found)):
            graph.add_edge(name, target)
    return graph


def stage_of(module: str) -> str | None:
    return next((s for s in STAGES if module == s or module.startswith(s + ".")), None)


def layer(module: str) -> str:
    if stage_of(module):
        return "stage"
    return "application" if module in APPLICATION else "core"


def violations(graph: nx.DiGraph) -> list[str]:
    """Every import that breaks the layer rule, as 'a imports b (why)'."""
    bad = []
    for a, b in sorted(graph.edges):
        if layer(a) == "core" and layer(b) != "core":
            bad.append(f"{a} imports {b}: the core imports no stage and no application "
                       "module (if it is application code, add it to APPLICATION)")
        elif layer(a) == "stage" and layer(b) == "application":
            bad.append(f"{a} imports {b}: a stage imports no application module")
        elif layer(a) == "stage" and layer(b) == "stage" and stage_of(a) != stage_of(b):
            allowed = STAGE_IMPORTS[stage_of(a)]  # type: ignore[index]
            if not any(b == x or b.startswith(x + ".") for x in allowed):
                bad.append(f"{a} imports {b}: {stage_of(a)} may import only "
                           f"{', '.join(allowed) or 'the core'} from other stages")
    return bad


def test_the_parser_sees_imports() -> None:
    """The checks below can fail: the graph has the edges one can read in the sources."""
    graph = import_graph()
    assert graph.has_edge("t10c.codegen.lower", "t10c.partition")
    assert graph.has_edge("t10c.emulator.machine", "t10c.codegen.program")
    assert graph.has_edge("t10c.cli", "t10c.check")  # made inside a function: still counted
    assert graph.has_edge("t10c.partition", "t10c.partition.verify")
    assert not graph.has_edge("t10c.partition.verify", "t10c.partition")  # TYPE_CHECKING only
    assert {"t10c.ir", "t10c.chips", "t10c.dtypes"} <= {m for m in graph if layer(m) == "core"}
    assert set(APPLICATION) <= set(graph), set(APPLICATION) - set(graph)


def test_rule_catches_a_violation() -> None:
    graph = nx.DiGraph([("t10c.ir", "t10c.partition"), ("t10c.frontend.loader", "t10c.models"),
                        ("t10c.emulator.machine", "t10c.codegen.lower"),
                        ("t10c.codegen.lower", "t10c.partition.plan"),
                        ("t10c.partition.search", "t10c.cli")])
    assert [v.split(":")[0] for v in violations(graph)] == [
        "t10c.emulator.machine imports t10c.codegen.lower",
        "t10c.frontend.loader imports t10c.models", "t10c.ir imports t10c.partition",
        "t10c.partition.search imports t10c.cli"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_layer_rule() -> None:
    bad = violations(import_graph())
    assert not bad, "\n".join(bad)
