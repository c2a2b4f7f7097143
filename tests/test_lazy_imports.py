"""gac's own modules are imported at module top; the few imports inside functions outside cli/ each say why."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gac"
MOST_LAZY = 40  # imports of gac modules inside functions, outside cli/ (whose start-up path stays lazy)


def _lazy_gac_imports() -> list[tuple[str, int, str]]:
    """(module path, line, the comment that names its reason or "") of every gac import inside a function."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "cli":
            continue
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                own = (isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("gac"))) or (
                    isinstance(node, ast.Import) and any(a.name.startswith("gac") for a in node.names)
                )
                if own:
                    line, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
                    why = line.partition("#")[2] or (above.strip()[1:] if above.strip().startswith("#") else "")
                    found.append((str(rel), node.lineno, why.strip()))
    return found


def test_lazy_gac_imports_are_few():
    lazy = _lazy_gac_imports()
    assert len(lazy) <= MOST_LAZY, f"{len(lazy)} gac imports inside functions (at most {MOST_LAZY}): " + ", ".join(
        f"{p}:{n}" for p, n, _ in lazy
    )


def test_each_lazy_gac_import_names_its_reason():
    unexplained = [f"{p}:{n}" for p, n, why in _lazy_gac_imports() if not why]
    assert not unexplained, "a gac import inside a function without a comment saying why: " + ", ".join(unexplained)
