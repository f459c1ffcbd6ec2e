"""Every place gpunb's code touches the file system by itself, found with ``ast`` (nothing is
imported): ``open``, ``os.open``/``fdopen``, ``Path.read_*``/``write_*``/``open``/``mkdir``,
``os`` calls that create, move or remove, ``shutil`` and ``tempfile`` calls, and torch exports
that take a path. ``tests/test_file_access_guard.py`` holds them against an allow-list."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpunb"
GUARD = "readings/untrusted_file.py"  # the one guarded place: everything in it is the point

OS_CALLS = {"open", "fdopen", "replace", "rename", "renames", "mkdir", "makedirs", "symlink", "link", "chmod",
            "chown", "unlink", "remove", "rmdir", "removedirs", "mkfifo", "mknod", "truncate", "utime"}
PATH_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "mkdir", "touch", "symlink_to",
                "hardlink_to", "unlink", "rmdir"}
SHUTIL_CALLS = {"copy", "copy2", "copyfile", "copyfileobj", "copytree", "move", "rmtree", "make_archive",
                "unpack_archive", "chown", "copymode", "copystat"}
TEMPFILE_CALLS = {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile",
                  "SpooledTemporaryFile"}
EXPORTS = {"export_chrome_trace", "export_stacks", "export_memory_timeline", "_dump_snapshot"}  # torch: take a path


@dataclass(frozen=True)
class Access:
    module: str  # path under gpunb/, e.g. "readings/peak_cache.py"
    function: str  # the enclosing function's qualified name ("<module>" at top level)
    call: str  # e.g. "open", "os.replace", "Path.write_text", "export_chrome_trace"


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return "open" if f.id == "open" else None
    if not isinstance(f, ast.Attribute):
        return None
    owner = f.value.id if isinstance(f.value, ast.Name) else ""
    if owner in ("os", "io") and f.attr in OS_CALLS:
        return f"{owner}.{f.attr}"
    if owner == "shutil" and f.attr in SHUTIL_CALLS:
        return f"shutil.{f.attr}"
    if owner == "tempfile" and f.attr in TEMPFILE_CALLS:
        return f"tempfile.{f.attr}"
    if f.attr in EXPORTS:
        return f.attr
    if f.attr in PATH_METHODS and owner not in ("os", "shutil"):
        return f"Path.{f.attr}"
    if f.attr == "open" and isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name) \
            and f.value.func.id in ("Path", "PurePath"):
        return "Path.open"
    return None


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.stack: list[str] = []
        self.found: list[Access] = []
        self._seen_calls: set[int] = set()

    def _scoped(self, node: ast.AST, name: str) -> None:
        self.stack.append(name)
        self.generic_visit(node)
        self.stack.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._scoped(node, node.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node, node.name)

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        if name is not None:
            self.found.append(Access(self.module, ".".join(self.stack) or "<module>", name))
        if isinstance(node.func, ast.Attribute) and node.func.attr in EXPORTS:
            self._seen_calls.add(id(node.func))  # counted once, as a call
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        """A torch export handed on uncalled (``write_trace(prof.export_chrome_trace, ...)``)."""
        if node.attr in EXPORTS and id(node) not in self._seen_calls:
            self.found.append(Access(self.module, ".".join(self.stack) or "<module>", node.attr))
        self.generic_visit(node)


def file_accesses(package: Path = PACKAGE) -> list[Access]:
    """Every file-system call outside the guarded module, in source order."""
    out: list[Access] = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module == GUARD:
            continue
        finder = _Finder(module)
        finder.visit(ast.parse(path.read_text(), filename=str(path)))
        out.extend(finder.found)
    return out
