"""The package layout (issue "one folder per concept"): dependency direction, no import circles,
no monster modules.

Imports are read statically (``ast``) from every module under ``oxygen_ros/``, including imports
inside functions and ``TYPE_CHECKING`` blocks: a circle hidden behind a local import is still a
circle. Layers, lowest first: ``core`` <- ``streams`` / ``bags`` <- ``ros`` <- ``replay`` / ``bench`` / ``sim`` /
``stats`` <- ``train`` <- ``evaluate``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "oxygen_ros"

# layer -> the layers it may import (itself included)
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "streams": {"core", "streams"},
    "bags": {"core", "bags"},
    "ros": {"core", "streams", "bags", "ros"},  # the oxygen CLI records bags (oxygen record)
    "replay": {"core", "streams", "ros", "bags", "replay"},
    "bench": {"core", "streams", "ros", "bags", "bench"},  # the ingress benchmark runs the node
    "sim": {"core", "streams", "ros", "bags", "sim"},
    "stats": {"core", "streams", "ros", "bags", "stats"},
    "train": {"core", "streams", "ros", "bags", "sim", "stats", "train"},  # reads the sim's demonstration bags
    "evaluate": {"core", "streams", "ros", "bags", "replay", "sim", "train", "evaluate"},
    "": {""},  # oxygen_ros/__init__.py imports nothing of its subpackages
}
# A generous guard against monster modules, not a size to aim for: folders and modules follow
# concepts, and a long module with one job stays whole. Split along a seam, never to meet a number.
MAX_LINES = 800


def module_name(path: Path) -> str:
    """Dotted module name of a file under the repo (``pkg/__init__.py`` -> ``pkg``)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``oxygen_ros`` modules ``name`` imports (relative imports resolved; ``from pkg import
    sub`` counts as importing ``pkg.sub`` when that is a module)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                up = base[: len(base) - (node.level - 1)]
                mod = ".".join(up + ([mod] if mod else []))
            targets = [(mod, [a.name for a in node.names])]
        else:
            continue
        for mod, names in targets:
            if not mod.startswith("oxygen_ros"):
                continue
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in known]
            found.update(subs if subs and len(subs) == len(names) else [mod, *subs])
    found.discard(name)
    return {m for m in found if m in known}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def layer(name: str) -> str:
    """``oxygen_ros.ros.convert.images`` -> ``ros``; the package root -> ``''``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def direction_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points against the layer order, as ``a -> b`` lines."""
    return sorted(
        f"{a} -> {b}" for a, deps in graph.items() for b in deps if layer(b) not in ALLOWED.get(layer(a), set())
    )


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
            visit(v)
    return out


def test_every_top_level_folder_is_a_known_layer():
    layers = {layer(m) for m in modules()}
    assert layers == set(ALLOWED), layers ^ set(ALLOWED)


def test_imports_point_down_the_layers():
    assert direction_violations(import_graph()) == []


def test_no_import_circles_anywhere():
    assert circles(import_graph()) == []


def test_the_checks_catch_a_core_module_importing_ros_and_a_circle():
    """The checks can fail: core importing the ROS layer, bench importing replay, a 2-module circle."""
    graph = import_graph()
    graph["oxygen_ros.core.policy"] = graph["oxygen_ros.core.policy"] | {"oxygen_ros.ros.node"}
    graph["oxygen_ros.bench.bench"] = graph["oxygen_ros.bench.bench"] | {"oxygen_ros.replay.replay"}
    assert direction_violations(graph) == [
        "oxygen_ros.bench.bench -> oxygen_ros.replay.replay",
        "oxygen_ros.core.policy -> oxygen_ros.ros.node",
    ]
    graph["oxygen_ros.core.types"] = graph["oxygen_ros.core.types"] | {"oxygen_ros.core.policy"}
    assert ["oxygen_ros.core.policy", "oxygen_ros.core.types"] in [c for c in circles(graph) if len(c) == 2] or any(
        {"oxygen_ros.core.policy", "oxygen_ros.core.types"} <= set(c) for c in circles(graph)
    )


def test_relative_and_local_imports_are_seen(tmp_path):
    """A function-local relative import is an edge like a top-level one."""
    pkg = REPO / "oxygen_ros" / "core" / "engine" / "engine.py"
    deps = imports_of("oxygen_ros.core.engine.engine", pkg, set(modules()))
    assert "oxygen_ros.core.engine.scheduler" in deps and "oxygen_ros.core.cache.kv_pool" in deps


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_modules_stay_small(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(REPO)} has {n} lines (> {MAX_LINES}): find the seams of its jobs"


def test_every_folder_says_what_lives_there_and_what_it_may_import():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower() and len(doc.splitlines()) >= 2, init.relative_to(REPO)


# ------------------------------------------------------------------ the repository explains itself
# No pointer to a design document kept outside the repository: a reference names a section of
# docs/architecture.md, or states the fact where it is needed. The needles are split so that this
# file does not match itself.
OUTSIDE_DOC_NEEDLES = ("DESIGN" + " §", "DESIGN" + ".md")
EXPLAINED_PLACES = ("oxygen_ros", "test", "docs", "config", "launch", "README.md", "Makefile")
GENERATED_PARTS = {"__pycache__", "_build"}


def outside_doc_references(root: Path) -> dict[str, list[int]]:
    """Every file under the explained places of ``root`` that points to a design document outside
    the repository: its path relative to ``root`` -> the line numbers that do."""
    found: dict[str, list[int]] = {}
    for place in EXPLAINED_PLACES:
        base = root / place
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            if GENERATED_PARTS & set(path.relative_to(root).parts):
                continue
            text = path.read_bytes().decode("utf-8", errors="replace")
            lines = [i for i, line in enumerate(text.splitlines(), 1) if any(n in line for n in OUTSIDE_DOC_NEEDLES)]
            if lines:
                found[path.relative_to(root).as_posix()] = lines
    return found


def test_no_pointer_to_a_design_document_outside_the_repository():
    found = outside_doc_references(REPO)
    assert found == {}, "say it in docs/architecture.md (and name the section) or state it in place"


def test_the_pointer_check_finds_a_pointer(tmp_path):
    """The check can fail: a docstring, a Makefile comment and a guide that point outside are found;
    a build folder is not read."""
    (tmp_path / "oxygen_ros" / "core").mkdir(parents=True)
    (tmp_path / "oxygen_ros" / "core" / "x.py").write_text('"""Rules.\n\nAs in ' + "DESIGN" + ' §4."""\n')
    (tmp_path / "Makefile").write_text("# see " + "DESIGN" + ".md\nall:\n")
    (tmp_path / "docs" / "_build").mkdir(parents=True)
    (tmp_path / "docs" / "_build" / "a.html").write_text("DESIGN" + " §1")
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\nClean.\n")
    assert outside_doc_references(tmp_path) == {"oxygen_ros/core/x.py": [3], "Makefile": [1]}
