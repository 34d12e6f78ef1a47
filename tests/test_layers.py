"""The package layers, checked: imports point down, never up or sideways, and no module cycles.

Every ``import harness...`` counts, module-level and inside functions alike (a lazy import is
still a dependency); only ``if TYPE_CHECKING:`` blocks are exempt (annotations, never run).
The layers are listed in ``docs/architecture.md``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "harness"

# Lower rank = lower layer. A package may import itself and any package of a smaller rank.
RANKS = {
    "core": 0,
    "metrics": 1,
    "tasks": 1,
    "tracking": 1,
    "model": 2,
    "ppo": 3,
    "sampling": 3,
    "config": 4,
    "peers": 5,
    "run": 6,
    "report": 6,
    "sweep": 7,
    "cli": 8,
    "__main__": 9,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str) -> str | None:
    """The harness module ``name`` refers to (a module, or the module defining a name)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("harness."):
                    found.add(_resolve(alias.name) or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "harness" or node.module.startswith("harness."):
                for alias in node.names:
                    target = _resolve(f"{node.module}.{alias.name}") or _resolve(node.module)
                    if target:
                        found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_sits_in_a_layer() -> None:
    loose = [m for m in MODULES if m != "harness" and package(m) not in RANKS]
    assert not loose, f"modules outside any layer (add a package or a rank): {loose}"
    flat = [m for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"]
    assert flat == ["harness.__main__"], f"modules flat in harness/: {flat}"


def test_imports_point_down() -> None:
    upward = []
    for module, targets in GRAPH.items():
        if module == "harness":
            continue
        mine = RANKS[package(module)]
        for target in targets:
            theirs = package(target)
            if theirs == package(module):
                continue
            if theirs not in RANKS or RANKS[theirs] >= mine:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that do not point to a lower layer:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


# Inside the sweep layer: its rooms, lowest first. A room may import itself and any lower room.
SWEEP_ROOMS = {"stores": 0, "scheduler": 1, "present": 2, "launching": 3}


def sweep_room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def test_every_sweep_module_sits_in_a_room() -> None:
    loose = [m for m in MODULES if package(m) == "sweep" and m != "harness.sweep"]
    loose = [m for m in loose if sweep_room(m) not in SWEEP_ROOMS]
    assert not loose, f"sweep modules outside any room (add one to a room): {loose}"


def test_sweep_rooms_import_down() -> None:
    upward = []
    for module, targets in GRAPH.items():
        if package(module) != "sweep" or module == "harness.sweep":
            continue
        mine = SWEEP_ROOMS[sweep_room(module)]
        for target in targets:
            if package(target) != "sweep" or sweep_room(target) == sweep_room(module):
                continue
            if SWEEP_ROOMS.get(sweep_room(target), mine) >= mine:
                upward.append(f"{module} -> {target}")
    assert not upward, "sweep imports that do not point to a lower room:\n" + "\n".join(
        sorted(upward)
    )


def test_the_config_layer_imports_no_peer_mapping() -> None:
    """The peers read a ``RunConfig`` (a layer above it); what ``trainer: trl`` cannot express
    reaches the config layer through its registry (``config.trainer_checks``), not an import."""
    assert RANKS["config"] < RANKS["peers"]
    found = sorted(
        f"{m} -> {t}"
        for m, ts in GRAPH.items()
        if package(m) == "config"
        for t in ts
        if package(t) == "peers"
    )
    assert found == []
    assert "harness.config.schema" in GRAPH["harness.peers.trl.problems"]


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_the_checker_sees_what_it_must() -> None:
    """The checks above can fail: an upward edge and a cycle in a made-up graph are found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # A lazy import inside a function counts; one under TYPE_CHECKING does not.
    assert "harness.model.logprobs" in GRAPH["harness.ppo.actor"]
    assert "harness.ppo.config" not in GRAPH["harness.ppo.actor"]
    # The commands' bodies (harness.cli.commands) sit in the cli layer; a command's one lazy
    # import of its body is an edge like any other.
    assert package("harness.cli.commands.sweep") == "cli"
    assert "harness.cli.commands.sweep" in GRAPH["harness.cli.sweep"]
    assert "harness.sweep.launching.driver" in GRAPH["harness.cli.commands.sweep"]
    # A sweep module's room is its sub-package, however deep the module sits in it.
    assert sweep_room("harness.sweep.launching.launchers.local") == "launching"
    assert sweep_room("harness.sweep.stores.storage") == "stores"


@pytest.mark.parametrize(
    "module",
    ["harness.ppo.objectives.frame", "harness.ppo.corrections.areal", "harness.ppo.normalization"],
)
def test_the_math_imports_no_harness_module_outside_ppo_and_core(module: str) -> None:
    assert {package(t) for t in GRAPH[module]} <= {"ppo", "core"}


DOCS = [ROOT.parent / "README.md", *sorted((ROOT.parent / "docs").glob("*.md"))]


def test_every_layer_is_described_and_every_cited_path_exists() -> None:
    """docs/architecture.md and the README's architecture section match the tree."""
    arch = (ROOT.parent / "docs" / "architecture.md").read_text()
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(RANKS) - {"__main__"}
    for pkg, rank in RANKS.items():
        if pkg != "__main__":
            assert f"| `{pkg}` | {rank} |" in arch, f"docs/architecture.md: no row for {pkg}"
    missing = []
    for doc in DOCS:
        for cited in re.findall(r"harness/[\w/]+(?:\.py)?", doc.read_text()):
            if not (ROOT.parent / cited).exists():
                missing.append(f"{doc.name}: {cited}")
    assert not missing, "paths cited in the docs that are not in the tree:\n" + "\n".join(missing)
