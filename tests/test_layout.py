"""The test suite's own layout: no file under tests/ imports a test module or a conftest (lazy imports inside
functions, relative ones and pytest_plugins included). What several files share is in tests/helpers*.py (plain
functions, classes and constants) or a conftest.py (fixtures, which pytest hands to the files below it): a test
module imported by another would run its module-level code twice and tie one file's tests to another's."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _forbidden(module: str) -> bool:
    """A test module (test_*.py) or a conftest, by its dotted name."""
    last = module.rpartition(".")[2]
    return last.startswith("test_") or last == "conftest"


def _base(module: str, is_package: bool, level: int) -> str:
    """The package a relative import of `level` dots names, from the module `module` (a package's __init__ when
    `is_package`)."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join(parts[:len(parts) - level + 1])


def imported_test_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every test module or conftest that `source` (the file of dotted name `module`) imports:
    `import a.test_b`, `from a.test_b import c`, `from a import test_b` (a test_* name imported from anywhere is a
    test module, or a test that pytest would collect again in the importer), their relative forms, and the modules a
    `pytest_plugins` assignment names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _base(module, is_package, node.level)
                base = f"{package}.{base}" if base else package
            if _forbidden(base):
                found.append((node.lineno, base))
            else:
                found += [(node.lineno, f"{base}.{a.name}") for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets):
            names = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            found += [(node.lineno, name) for name in names if _forbidden(name)]
    return found


def test_no_file_under_tests_imports_a_test_module_or_a_conftest():
    files = sorted(TESTS.rglob("*.py"))
    assert len([f for f in files if f.name.startswith("test_")]) > 50  # the walk found the suite
    bad = []
    for path in files:
        parts = path.relative_to(TESTS.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        for line, imported in imported_test_modules(path.read_text(), module, is_package):
            bad.append(f"{path.relative_to(TESTS.parent)}:{line} imports {imported}")
    assert not bad, ("move what is shared into tests/helpers*.py (or a conftest.py for fixtures) and import it from "
                     "there:\n" + "\n".join(bad))


def test_the_walk_finds_each_form_of_importing_a_test_module():
    source = """
import tests.models.test_moe_family
from tests.test_api import fast_config
from tests.conftest import TINY
from tests.serve import conftest
from .test_engine import MAX_REL_ERROR
from . import test_gguf_writer
from .. import conftest as root
pytest_plugins = ["tests.pipelines.test_memory", "tests.helpers"]

def lazy():
    from tests.objectives.test_latency import objective

import tests.helpers
from tests.helpers_tiny import tiny_model
from tests import helpers
from . import helpers_local
from gac.testing import test_mode
"""
    assert sorted(imported_test_modules(source, "tests.export.test_x")) == [
        (2, "tests.models.test_moe_family"), (3, "tests.test_api"), (4, "tests.conftest"),
        (5, "tests.serve.conftest"), (6, "tests.export.test_engine"), (7, "tests.export.test_gguf_writer"),
        (8, "tests.conftest"), (9, "tests.pipelines.test_memory"), (12, "tests.objectives.test_latency"),
        (18, "gac.testing.test_mode")]  # a test_* name: a module, or a test pytest would collect here again
    assert imported_test_modules("from . import conftest", "tests.export", is_package=True) == [
        (1, "tests.export.conftest")]
