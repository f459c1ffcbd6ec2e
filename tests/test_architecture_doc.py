"""docs/architecture.md draws the capability graph that tests/import_rules.py enforces: the two
cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from tests.import_rules import CAPABILITY_USES, SHARED

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _mermaid_blocks() -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def _capability_graph() -> tuple[set[str], set[tuple[str, str]]]:
    """Nodes and solid edges (`a --> b`: a imports b) of the diagram under "## Capabilities"."""
    section = DOC.read_text(encoding="utf-8").split("## Capabilities", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```mermaid\n(.*?)```", section, re.S)
    assert block, "docs/architecture.md: the Capabilities section has no mermaid diagram"
    nodes: set[str] = set()
    edges: set[tuple[str, str]] = set()
    for line in block.group(1).splitlines()[1:]:  # the first line is the diagram kind
        line = line.strip()
        if not line:
            continue
        edge = re.fullmatch(r"(\w+)\s*-->\s*(\w+)", line)
        if edge:
            edges.add((edge.group(1), edge.group(2)))
            nodes.update(edge.groups())
            continue
        node = re.match(r"(\w+)(?:\[|$)", line)
        assert node, f"docs/architecture.md: cannot read the mermaid line {line!r}"
        nodes.add(node.group(1))
    return nodes, edges


def test_the_doc_draws_every_capability_and_only_the_allowed_imports():
    nodes, edges = _capability_graph()
    allowed = {(src, dst) for src, uses in CAPABILITY_USES.items() for dst in uses}
    assert nodes - {"shared"} == set(CAPABILITY_USES), "capabilities in the doc differ from CAPABILITY_USES"
    assert edges == allowed, (f"the doc draws {sorted(edges - allowed)} that CAPABILITY_USES does not allow and "
                              f"misses {sorted(allowed - edges)}: change docs/architecture.md with the rules")


def test_the_doc_names_the_shared_modules_and_every_capability_in_its_table():
    text = DOC.read_text(encoding="utf-8")
    for module in SHARED:
        assert module in text, f"docs/architecture.md does not name the shared module {module}"
    for capability in CAPABILITY_USES:
        assert f"| `{capability}` |" in text, f"docs/architecture.md has no table row for {capability}"
    assert len(_mermaid_blocks()) >= 2, "the layer diagram and the capability diagram"
