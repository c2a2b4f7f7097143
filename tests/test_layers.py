"""The package's import graph: no file imports one that imports it back (directly or through others, lazy imports
inside functions included), and the layers depend downward only. docs/DESIGN.md's layer table states the same rules
(tests/test_design.py checks that they agree)."""

import ast
from pathlib import Path

import pytest

from tests.helpers_layers import ABOVE, ALLOWED, LEAVES

SRC = Path(__file__).resolve().parents[1] / "src" / "gac"
PROJECTION_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "fc1", "fc2")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """{module: gac modules it imports}, where `from gac.x import y` counts gac.x.y when y is a module."""
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("gac")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gac") and not node.level:
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files}
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for d in sorted(graph[n]):
            if d.count(".") == 1 and n.startswith(d + "."):
                continue  # a package's own __init__ (gac.x) importing from its submodules is not a cycle back
            if state.get(d) == "open":
                return [*stack[stack.index(d):], d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 40  # the walk found the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"gac.a": {"gac.b"}, "gac.b": {"gac.c"}, "gac.c": {"gac.a"}}) == ["gac.a", "gac.b", "gac.c", "gac.a"]
    assert _cycle({"gac.a": {"gac.b"}, "gac.b": set()}) is None




def test_every_package_has_a_layer():
    """A new package or top-level module takes its place in ALLOWED (or LEAVES), so the walk checks it."""
    known = set(ALLOWED) | ABOVE
    tops = {".".join(name.split(".")[:2]) for name in _graph()}
    assert tops <= known, f"not in a layer: {sorted(tops - known)}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_depend_downward(layer):
    graph = _graph()
    allowed = ALLOWED[layer] | {layer} | LEAVES
    for module, deps in graph.items():
        if module == layer or module.startswith(layer + "."):
            bad = {d for d in deps if not any(d == a or d.startswith(a + ".") for a in allowed) and d != "gac"}
            assert not bad, f"{module} imports {sorted(bad)} from above its layer"


def test_projection_names_only_in_the_family_adapters():
    for path in SRC.rglob("*.py"):
        if path.name == "adapters.py":
            continue
        text = path.read_text()
        spelled = [p for p in PROJECTION_NAMES if f'"{p}"' in text or f"'{p}'" in text or f".{p}" in text]
        assert not spelled, f"{path.relative_to(SRC)} spells {spelled}: ask gac.models.adapters or the groups"


def test_no_module_switches_on_a_group_kind():
    """A kind's behaviour is on the kind (gac.models.kinds): no isinstance(..., <Kind>Group) anywhere else."""
    kinds = SRC / "models" / "kinds"
    found = []
    for path in SRC.rglob("*.py"):
        if kinds in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                names = [n.id if isinstance(n, ast.Name) else getattr(n, "attr", "") for n in ast.walk(node.args[1])]
                if any(name.endswith("Group") for name in names):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"switches on a group kind: {found}; ask the group (DimGroup) instead"


GEOMETRY_FIELDS = (
    r"config\.(hidden_size|num_attention_heads|intermediate_size|num_key_value_heads|num_hidden_layers|head_dim)\b"
)


def test_config_geometry_only_through_the_family_adapters():
    """A family may name its sizes otherwise (Phi-3, Gemma's text_config): only the adapter reads them
    (modeling_gac.py and the DeciLM code travel alone with a saved model and cannot ask it)."""
    import re

    for path in SRC.rglob("*.py"):
        if path.name in ("adapters.py", "modeling_gac.py", "configuration_decilm.py", "modeling_decilm.py"):
            continue
        found = re.findall(GEOMETRY_FIELDS, path.read_text())
        assert not found, f"{path.relative_to(SRC)} reads config.{found}: ask gac.models.adapters"
