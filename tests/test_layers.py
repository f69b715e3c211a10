"""The house's floors, read from the source: model/ imports neither app/ nor training/, app/ and
training/ do not import each other, only the `nmt` command stands over all three, and no two
modules import each other at load time (an import circle)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nmt", "model", "app", "training")
# what each package may import of the others (lazily inside a function too)
ALLOWED = {"nmt": {"model", "app", "training"}, "model": set(), "app": {"model"}, "training": {"model"}}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str], top_level_only: bool) -> set[str]:
    """The project modules a file imports ("from app import markup" is app.markup when that is a
    module); with top_level_only, only those imported when the module loads."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                    for alias in node.names}
    return {name for name in out if name.split(".")[0] in PACKAGES}


def test_each_package_imports_only_the_floors_below_it():
    found = modules()
    wrong = []
    for name, path in found.items():
        package = name.split(".")[0]
        for imported in imports(path, set(found), top_level_only=False):
            other = imported.split(".")[0]
            if other != package and other not in ALLOWED[package]:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    found = modules()
    graph = {name: imports(path, set(found), top_level_only=True) & set(found) for name, path in found.items()}
    circles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for imported in sorted(graph[name]):
            if imported.startswith(name + "."):  # a package importing its own modules from its __init__
                continue
            if state.get(imported) == 1:
                circles.append(" -> ".join(path[path.index(imported):] + [imported]))
            elif imported not in state:
                visit(imported, path + [imported])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "\n".join(circles)
