"""docs/DESIGN.md stays a map: short, naming every module of src/gac, linking every decision page, its links live, and
its layer table the rules tests/test_layers.py enforces."""

import re
from pathlib import Path

from tests.helpers_layers import ABOVE, ALLOWED

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DESIGN = DOCS / "DESIGN.md"
SRC = ROOT / "src" / "gac"
MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """(heading, body lines) per Markdown heading, fenced code left out; the text before the first heading has ''."""
    sections, fenced = [("", [])], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            sections.append((line, []))
        else:
            sections[-1][1].append(line)
    return sections


def named_modules(text: str) -> set[str]:
    """Module paths (relative to src/gac) the text names: in backticks by that path anywhere, or by the part of it
    below a folder `F/` that the heading of its section names (`run.py` under a heading naming `pipelines/`)."""
    named = set()
    for heading, body in _sections(text):
        folders = [""] + [f for f in CODE.findall(heading) if f.endswith("/")]
        for name in CODE.findall(heading + "\n" + "\n".join(body)):
            if name.endswith(".py"):
                named |= {folder + name for folder in folders}
    return named


def test_design_is_a_short_map():
    lines = DESIGN.read_text().count("\n")
    assert lines <= MAX_LINES, f"docs/DESIGN.md has {lines} lines (at most {MAX_LINES}): move detail to docs/decisions/"


def test_design_names_every_module():
    modules = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if p.name != "__init__.py"}
    assert len(modules) > 40  # the walk found the package
    missing = sorted(modules - named_modules(DESIGN.read_text()))
    assert not missing, (
        f"docs/DESIGN.md does not name {missing}: add each under its package's heading (`file.py`, or `sub/file.py` "
        "below it) or by its path from src/gac, with a few words"
    )


def test_named_modules_reads_headings_and_paths():
    text = "# Map\n`api.py` and `models/dims.py`\n### `pipelines/`: the axis\n- `run.py`, `layerwise/analyze.py`\n"
    assert {"api.py", "models/dims.py", "pipelines/run.py", "pipelines/layerwise/analyze.py"} <= named_modules(text)
    assert "run.py" in named_modules(text)  # a bare name is also its own path: a top-level module's
    assert "quantize/run.py" not in named_modules(text + "### `heal/`\n`run.py`\n")  # only under its own heading


def _links(path: Path) -> list[str]:
    return [target for target in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", target)]


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_decision_page_is_linked_from_design():
    pages = sorted(p.name for p in (DOCS / "decisions").glob("*.md"))
    assert pages, "docs/decisions/ holds no page"
    linked = {Path(t.split("#")[0]).name for t in _links(DESIGN) if t.startswith("decisions/")}
    unlinked = [p for p in pages if p not in linked]
    assert not unlinked, f"docs/DESIGN.md's decision index does not link {unlinked}: add a line under ## Decisions"


def test_links_resolve():
    """Every relative link of DESIGN.md and of the decision pages names a file that exists, and a heading there."""
    broken = []
    for page in [DESIGN, *sorted((DOCS / "decisions").glob("*.md"))]:
        for target in _links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                headings = {_slug(h) for h, _ in _sections(dest.read_text())[1:]}
                if anchor not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, f"broken links: {broken}"


def _short(name: str) -> str:
    return name.removeprefix("gac.")


def layer_table(text: str) -> dict[str, frozenset[str] | None]:
    """The rows of DESIGN.md's layer table: {layer: what it may import}, None for the unchecked top."""
    body = next(body for heading, body in _sections(text) if heading == "## Layers")
    rows = [line for line in body if line.startswith("| `")]
    table = {}
    for row in rows:
        layers, may = (cell.strip() for cell in row.strip("|").split("|"))
        allowed = None if may.startswith("anything") else frozenset(CODE.findall(may))
        table |= dict.fromkeys(CODE.findall(layers), allowed)
    return table


def test_layer_table_states_the_rules_test_layers_enforces():
    enforced = {_short(layer): frozenset(map(_short, may)) for layer, may in ALLOWED.items()}
    enforced |= {_short(top): None for top in ABOVE}
    stated = layer_table(DESIGN.read_text())
    assert stated == enforced, (
        "docs/DESIGN.md's layer table and tests/test_layers.py's ALLOWED differ: "
        f"only in DESIGN {sorted(set(stated.items()) - set(enforced.items()), key=str)}, "
        f"only in the test {sorted(set(enforced.items()) - set(stated.items()), key=str)}"
    )
