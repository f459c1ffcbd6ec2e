"""The import rules of docs/architecture.md, checked from the source with ``ast`` (nothing is imported).

Every ``import``/``from ... import`` inside the package counts, at module level and inside
functions (a lazy import hides a dependency from the reader, not from the design). Three checks:

- **cycles**: the graph of module -> module imports has no cycle;
- **direction**: readings -> analysis -> views -> shells; a module imports only from its own
  layer or the ones below, with no exception (records never import their views: the views
  register themselves in ``gpunb.display``). Foundation modules (``units``, ``display``,
  ``_version``) import no layer; the entry points (the package ``__init__``, ``cli``,
  ``__main__``) may import any;
- **capabilities**: ``analysis`` is split by capability (``analysis/checks``, ``profile``, ...).
  A capability uses ``readings``, the foundation, the shared analysis modules
  (:data:`SHARED`), itself, and only the other capabilities :data:`CAPABILITY_USES` names for
  it: the allowed graph, written down;
- **the shell**: only the shells layer (and the entry points) imports IPython, ipykernel or
  ipywidgets, or calls ``get_ipython``: analysis gets the namespace, a progress callback or an
  in-kernel flag as arguments.

Imports under ``if TYPE_CHECKING:`` never run: they count for the direction rules, not for
cycles (a view may name the record type it renders while the record imports the view lazily).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

LAYERS = ("readings", "analysis", "views", "shells")
FOUNDATION = ("units", "display", "_version")
ENTRY_POINTS = ("", "cli", "__main__")  # "" is the package's own __init__
# The fake NVML is what readings load instead of the driver (GPUNB_FAKE_NVML): the readings layer.
SAME_AS = {"testing": "readings"}
SHELL_PACKAGES = ("IPython", "ipykernel", "ipywidgets")

# analysis/<capability>/ -> the other capabilities it may import. Everything else between
# capabilities is refused; a new capability must be added here (with what it uses).
CAPABILITY_USES: dict[str, frozenset[str]] = {
    "checks": frozenset(),
    "steps": frozenset(),  # the hooks inside one training process
    "ranks": frozenset({"steps"}),  # each worker runs the same step hooks
    # a cell's steps, its worker processes, its energy, the memory that grows every step
    "profile": frozenset({"steps", "ranks", "energy", "leaks"}),
    "memory": frozenset({"holders"}),  # the OOM doctor names the other processes on the GPU
    "fit": frozenset({"memory"}),  # a trial recognises an OOM
    "holders": frozenset(),
    "monitor": frozenset({"energy"}),  # energy since the monitor started
    "energy": frozenset(),  # the GPUs' energy over a window, its price
    "leaks": frozenset({"memory"}),  # memory that grows every step, its holder named by the census
    # a planned step: the trace record and line folding (memory), what a step reaches (fit)
    "plan": frozenset({"memory", "fit"}),
}
# analysis/<module>.py beside the capabilities: small pieces every capability may use; they
# import no capability.
SHARED = ("advice", "gpu_specs", "machine", "torch_wheels", "reach")


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (a module of the package)
    line: int
    function: str | None  # enclosing function, None at module level
    type_only: bool = False  # under ``if TYPE_CHECKING:``: read by type checkers, never run


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (the package directory)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Visitor(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module, self.is_package, self.known = module, is_package, known
        self.found: list[Import] = []
        self.shell_imports: list[Import] = []  # IPython & co., by this module
        self._functions: list[str] = []
        self._type_only = 0

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer = self._functions
        self._functions = []  # a method is named by itself, not by an enclosing function
        self.generic_visit(node)
        self._functions = outer

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._functions.append(node.name)
        self.generic_visit(node)
        self._functions.pop()

    visit_FunctionDef = _visit_function

    def _shell_lookup(self, name: str, line: int) -> None:
        if name == "get_ipython":  # finding the shell without importing it (sys.modules["IPython"])
            self.shell_imports.append(Import(self.module, "IPython.get_ipython", line,
                                             self._functions[-1] if self._functions else None))

    def visit_Name(self, node: ast.Name) -> None:
        self._shell_lookup(node.id, node.lineno)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._shell_lookup(node.attr, node.lineno)
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self._type_only += 1
        for child in node.body:
            self.visit(child)
        self._type_only -= 1
        for child in node.orelse:
            self.visit(child)
    visit_AsyncFunctionDef = _visit_function

    def _add(self, target: str, line: int) -> None:
        if target.split(".")[0] in SHELL_PACKAGES:
            function = self._functions[-1] if self._functions else None
            self.shell_imports.append(Import(self.module, target, line, function, self._type_only > 0))
            return
        # "from pkg.sub import name": name may be a submodule; else the edge goes to pkg.sub
        while target and target not in self.known:
            target = target.rpartition(".")[0]
        if target and target != self.module:
            self.found.append(Import(self.module, target, line, self._functions[-1] if self._functions else None,
                                     self._type_only > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(node, self.module, self.is_package)
        for alias in node.names:
            self._add(f"{base}.{alias.name}" if alias.name != "*" else base, node.lineno)


def imports(root: Path, package: str) -> tuple[list[Import], list[Import]]:
    """(every import of a package module by a package module, every import of IPython & co.)"""
    modules = module_names(root, package)
    known = set(modules)
    found: list[Import] = []
    shell: list[Import] = []
    for name, path in modules.items():
        visitor = _Visitor(name, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        found += visitor.found
        shell += visitor.shell_imports
    return found, shell


def cycles(found: list[Import]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted. Every import
    that runs counts, lazy ones too; type-only imports do not (they never run)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        if imp.type_only:
            continue
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def layer_of(module: str, package: str) -> int | None:
    """0..3 for readings..shells, -1 for foundation modules, None for entry points."""
    first = module.removeprefix(package).lstrip(".").split(".")[0]
    first = SAME_AS.get(first, first)
    if first in LAYERS:
        return LAYERS.index(first)
    if first in FOUNDATION:
        return -1
    if first in ENTRY_POINTS:
        return None
    raise ValueError(f"{module} belongs to no layer: add it to LAYERS, FOUNDATION or ENTRY_POINTS in {__file__}")


def upward(found: list[Import], package: str) -> list[str]:
    """Imports from a higher layer."""
    bad = []
    for imp in found:
        src, dst = layer_of(imp.source, package), layer_of(imp.target, package)
        if src is None or dst is None or dst <= src:
            continue
        where = f"in {imp.function}()" if imp.function else "at module level"
        bad.append(f"{imp.source}:{imp.line} imports {imp.target} {where}")
    return bad


def capability_of(module: str, package: str) -> str | None:
    """``analysis/<capability>/`` of a module; "" for a shared analysis module; None outside analysis.
    A module directly in ``analysis`` that is not shared is named (it belongs in a capability)."""
    parts = module.removeprefix(package).lstrip(".").split(".")
    if parts[0] != "analysis" or len(parts) == 1:
        return None
    if len(parts) == 2 and parts[1] not in CAPABILITY_USES:
        if parts[1] in SHARED:
            return ""
        raise ValueError(f"{module} is in no capability: move it into analysis/<capability>/ or add it to SHARED "
                         f"in {__file__}")
    if parts[1] not in CAPABILITY_USES:
        raise ValueError(f"{module}: capability {parts[1]!r} is not in CAPABILITY_USES ({__file__})")
    return parts[1]


def across_capabilities(found: list[Import], package: str) -> list[str]:
    """Imports between analysis capabilities that CAPABILITY_USES does not allow, and imports of
    a capability by a shared module."""
    bad = []
    for imp in found:
        src, dst = capability_of(imp.source, package), capability_of(imp.target, package)
        if src is None or dst is None or src == dst or dst == "":
            continue
        if src == "" or dst not in CAPABILITY_USES[src]:
            where = f"in {imp.function}()" if imp.function else "at module level"
            who = "a shared module" if src == "" else f"capability {src!r}"
            bad.append(f"{imp.source}:{imp.line} imports {imp.target} {where} ({who} may not use {dst!r})")
    return bad


def shell_outside_shells(shell_imports: list[Import], package: str) -> list[str]:
    """Imports of IPython, ipykernel or ipywidgets below the shells layer."""
    shells = LAYERS.index("shells")
    bad = []
    for imp in shell_imports:
        layer = layer_of(imp.source, package)
        if layer is not None and layer < shells:
            where = f"in {imp.function}()" if imp.function else "at module level"
            bad.append(f"{imp.source}:{imp.line} imports {imp.target} {where} (only the shells layer talks to IPython)")
    return bad


def violations(root: Path, package: str) -> list[str]:
    """Every broken rule, in words; empty when the package keeps them all."""
    for module in module_names(root, package):
        layer_of(module, package)  # a new module outside every layer is named, not ignored
        capability_of(module, package)
    found, shell = imports(root, package)
    found_all = ([f"import cycle: {' <-> '.join(group)}" for group in cycles(found)] + upward(found, package)
                 + across_capabilities(found, package) + shell_outside_shells(shell, package))
    return list(dict.fromkeys(found_all))  # "from m import a, b" is one import, said once
