"""The package's structure holds: no import circle (imports inside functions counted), and core
naming no command. (The layers of docs/architecture.md, pyproject.toml's import-linter contract,
are make check's: lint-imports.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "gpubench"


def _circles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_counting_imports_inside_functions():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("gpubench", exclude_type_checking_imports=True)
    assert _circles(graph) == []


def _string_constants(tree: ast.AST) -> list[ast.Constant]:
    """Every str constant of a module that is not a docstring."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


# what a layer above the plug-ins may still say: the env's "nccl" block (the NCCL library and its
# NCCL_* variables, which any command may record) is a field of the environment, not a command
ALLOWED = {("analysis/compare.py", "nccl")}


@pytest.mark.parametrize("layer", ["core", "launch", "validation", "analysis", "cli"])
def test_no_layer_but_the_plugins_names_a_command(layer):
    from gpubench.core import registry

    # the measuring commands ("env" is also the name of every Result's environment field)
    names = {p.name for p in registry.measuring() if p.command.startswith("gpubench.")} - {"env"}
    hits = []
    for p in sorted((SRC / layer).glob("*.py")):
        rel = str(p.relative_to(SRC))
        hits += [f"{rel}:{c.lineno}: {c.value!r}" for c in _string_constants(ast.parse(p.read_text()))
                 if c.value in names and (rel, c.value) not in ALLOWED]
    assert hits == []
