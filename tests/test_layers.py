"""The jobs return data; the CLI renders (README "Architecture", issue 13 item 7).

Read statically with ``ast`` (nothing is imported): every ``import`` and ``from ... import`` of every
module of the package, including imports inside functions. Rendering libraries (rich's tables, live
views and consoles; matplotlib's plots) may be imported only under ``servefleet/cli/``; the jobs and
the layers below them never print.
"""

from __future__ import annotations

import ast
from pathlib import Path

import servefleet

PACKAGE = Path(servefleet.__file__).resolve().parent
RENDERING = ("rich", "matplotlib")
# The simulator's own `python -m servefleet.sim` entry point prints its dry-run report (a test
# double with its own command line, reached from the CLI's `sim` command).
PRINT_ALLOWED = {"sim/__main__.py"}


def _modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 50, f"the package was not found at {PACKAGE}"
    return found


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def imported_modules(source: str) -> set[str]:
    """Top-level names of every module an ``import`` statement anywhere in ``source`` names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_imported_modules_sees_every_kind_of_import() -> None:
    source = (
        "import rich.table as t\n"
        "from matplotlib import pyplot\n"
        "def f():\n    import json\n    from .x import y\n"
        "class C:\n    from rich.console import Console\n"
    )
    assert imported_modules(source) == {"rich", "matplotlib", "json"}


def test_only_the_cli_imports_rendering_libraries() -> None:
    offenders = {}
    for path in _modules():
        rel = _rel(path)
        used = imported_modules(path.read_text()) & set(RENDERING)
        if used and not rel.startswith("cli/"):
            offenders[rel] = sorted(used)
    assert offenders == {}, "return data and render it under servefleet/cli/"


def test_only_the_cli_prints() -> None:
    offenders = {}
    for path in _modules():
        rel = _rel(path)
        if rel.startswith("cli/") or rel in PRINT_ALLOWED:
            continue
        lines = [
            node.lineno
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
        ]
        if lines:
            offenders[rel] = lines
    assert offenders == {}, "print() outside the CLI: return data, and let the CLI render it"
