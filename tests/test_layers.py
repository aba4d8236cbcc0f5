"""The layers of DESIGN §2: dependencies only point down, and no module imports itself back.

Every import statement of the tree is read from the source (including those under
`TYPE_CHECKING` and inside functions: a lazy import is still a dependency), so a violation
fails with the file, the line and the import that broke the rule.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "handlers")
# Third-party packages the pure layer may use besides the standard library.
CORE_THIRD_PARTY = frozenset({"pydantic", "pydantic_core", "yaml"})


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. "bot.services.waves"
    target: str  # the imported module, e.g. "bot.github.client"
    where: str  # "bot/services/waves.py:12"

    def __str__(self) -> str:
        return f"{self.where}: {self.module} imports {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> Iterator[Import]:
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, where)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if node.module is None or _is_package(base):
                # `from bot.core import commands` imports the module bot.core.commands.
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    yield Import(module, candidate if _exists(candidate) else base, where)
            else:
                yield Import(module, base, where)


def _is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").exists()


def _exists(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


@cache
def all_imports() -> list[Import]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.extend(imports_of(path))
    return found


def within(name: str, *prefixes: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def is_klaud(name: str) -> bool:
    return within(name, *PACKAGES)


# (importer, forbidden targets) as DESIGN §2 lists them.
FORBIDDEN: list[tuple[str, tuple[str, ...]]] = [
    ("bot.store", ("bot.github", "bot.services", "bot.web", "handlers", "bot.sandbox", "bot.app", "bot.cli", "bot.runtime")),
    ("bot.github", ("bot.store", "bot.services", "bot.web", "handlers", "bot.sandbox", "bot.app", "bot.cli", "bot.runtime")),
    ("bot.services", ("bot.web", "handlers", "bot.sandbox", "bot.app", "bot.cli", "bot.runtime")),
    ("handlers", ("bot.store", "bot.github", "bot.web", "bot.sandbox", "bot.app", "bot.cli", "bot.runtime")),
    ("bot.web", ("handlers", "bot.sandbox", "bot.app", "bot.cli", "bot.runtime")),
    # Leaves every layer may use: they import nothing of Klaud's.
    ("bot.settings", PACKAGES),
    ("bot.metrics", PACKAGES),
    ("bot.log", PACKAGES),
]
SANDBOX_IMPORTERS = ("bot.app", "bot.cli", "bot.runtime", "bot.sandbox")


def violations(imports: list[Import]) -> list[str]:
    found = []
    for imp in imports:
        if within(imp.module, "bot.core"):
            top = imp.target.split(".")[0]
            allowed = (
                within(imp.target, "bot.core")
                or top in sys.stdlib_module_names
                or top in CORE_THIRD_PARTY
                or imp.target == "__future__"
            )
            if not allowed:
                found.append(f"{imp} (bot.core uses only the standard library, pydantic, PyYAML and bot.core)")
        sandbox_reaches_out = within(imp.module, "bot.sandbox") and is_klaud(imp.target)
        if sandbox_reaches_out and not within(imp.target, "bot.sandbox", "bot.core"):
            found.append(f"{imp} (the sandbox uses nothing of Klaud's but bot.core)")
        if within(imp.target, "bot.sandbox") and not within(imp.module, *SANDBOX_IMPORTERS):
            found.append(f"{imp} (only bot.app, bot.cli and bot.runtime may use the sandbox)")
        for importer, targets in FORBIDDEN:
            if within(imp.module, importer) and within(imp.target, *targets) and not within(imp.target, importer):
                found.append(f"{imp} ({importer} must not import {imp.target.split('.')[0] if imp.target.startswith('handlers') else '.'.join(imp.target.split('.')[:2])})")
    return found


def cycles(imports: list[Import]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if is_klaud(imp.target) and imp.target != imp.module:
            graph.setdefault(imp.module, set()).add(imp.target)
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            # A package's __init__ importing its own submodules is how packages re-export.
            if within(nxt, node) or within(node, nxt):
                continue
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_dependencies_point_down() -> None:
    problems = violations(all_imports())
    assert not problems, "layer violations:\n" + "\n".join(problems)


def test_no_import_cycles() -> None:
    found = cycles(all_imports())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_the_check_sees_a_violation_and_a_cycle() -> None:
    # The rules must be able to fail: a core module importing aiohttp, a service importing
    # the web layer, and two modules importing each other.
    fake = [
        Import("bot.core.planner", "aiohttp", "bot/core/planner.py:1"),
        Import("bot.services.waves", "bot.web.server", "bot/services/waves.py:1"),
        Import("bot.core.a", "bot.core.b", "bot/core/a.py:1"),
        Import("bot.core.b", "bot.core.a", "bot/core/b.py:1"),
    ]
    problems = violations(fake)
    assert any("bot/core/planner.py:1: bot.core.planner imports aiohttp" in p for p in problems)
    assert any("bot.services must not import bot.web" in p for p in problems)
    assert cycles(fake) == [["bot.core.a", "bot.core.b", "bot.core.a"]]
