"""The package's layout holds: seven floors, imports only downward, one way within a floor.

    surfaces  cli/ console/ api/ contrib/ chaos/ examples/ fakes/ testing status shapes alembic
    façade    box aio
    lanes     lanes/           every loop that runs, one file each
    runtime   runtime/         the Runtime and the verbs that take it (enqueue, fan-out, trigger)
    concepts  jobs/ queue/ outbox/ schedules/ timers/ retention/ deliveries/ limits/ providers/
              brokers/         declarations, rules and state machines
    store     store/           the Store protocol, its parameters and rows, both stores
    kernel    kernel/          the clock, errors, logs, metrics: what every floor may use

A module imports from its own floor or below, never above; the folders of one floor import each
other one way (no ring). Read from the source with `ast` (imports under `if TYPE_CHECKING:` count
too: a type-only import of the façade is still a lane that knows the façade), so the rules need no
import of the package's optional parts."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

import oncebox

PACKAGE = Path(oncebox.__file__).parent
FLOORS: dict[str, tuple[str, ...]] = {
    "surfaces": (
        "oncebox",  # the package's __init__: re-exports the public names
        "__main__",
        "cli",
        "console",
        "api",
        "contrib",
        "chaos",
        "examples",
        "fakes",
        "testing",
        "status",
        "shapes",
        "alembic",
        "keyguard",  # deprecated shims: they re-export from jobs/
        "periods",
    ),
    "façade": ("box", "aio"),
    "lanes": ("lanes",),
    "runtime": ("runtime",),
    "concepts": (
        "jobs",
        "queue",
        "outbox",
        "schedules",
        "timers",
        "retention",
        "deliveries",
        "limits",
        "providers",
        "brokers",
    ),
    "store": ("store",),
    "kernel": ("kernel",),
}
LEVEL = {part: level for level, parts in enumerate(FLOORS.values()) for part in parts}
FLOOR_OF = {part: floor for floor, parts in FLOORS.items() for part in parts}
MOST_LOOSE_MODULES = 10


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The oncebox modules `path` imports (`from oncebox import Box` counts as oncebox.box)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("oncebox")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "oncebox":
                for alias in node.names:
                    submodule = PACKAGE / f"{alias.name}.py"
                    package = PACKAGE / alias.name / "__init__.py"
                    if submodule.exists() or package.exists():
                        found.add(f"oncebox.{alias.name}")
                    elif alias.name == "Box":
                        found.add("oncebox.box")
                    else:  # a name the package's __init__ re-exports
                        found.add("oncebox")
            elif node.module.startswith("oncebox."):
                # `from oncebox import shapes` depends on the submodule, not on the
                # package's `__init__` (which re-exports and would close false cycles)
                folder = PACKAGE.joinpath(*node.module.split(".")[1:])
                for alias in node.names:
                    if (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir():
                        found.add(f"{node.module}.{alias.name}")
                    else:
                        found.add(node.module)
    return found


def sources() -> dict[str, set[str]]:
    return {
        str(path.relative_to(PACKAGE)): imports_of(path) for path in sorted(PACKAGE.rglob("*.py"))
    }


def cycles_of(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """One cycle through each node that is on one (as the path that closes it)."""

    def path_back(start: str) -> tuple[str, ...] | None:
        stack: list[tuple[str, tuple[str, ...]]] = [(start, (start,))]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return (*path, nxt)
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
        return None

    return {c for node in graph if (c := path_back(node)) is not None}


def import_graph(group: bool) -> dict[str, set[str]]:
    """Module → the modules it imports (or, `group`ed, concept package → packages). The
    package's `__init__` re-exports the public names and is left out."""

    def node(module: str) -> str:
        parts = module.split(".")
        if group and len(parts) >= 2 and (PACKAGE / parts[1]).is_dir():
            return parts[1]  # oncebox.lanes.consumer -> lanes
        return ".".join(parts[1:]) or "oncebox"

    graph: dict[str, set[str]] = {}
    for name, imported in sources().items():
        if name == "__init__.py":
            continue
        here = node(module_name(PACKAGE / name))
        for module in imported:
            if module != "oncebox" and (there := node(module)) != here:
                graph.setdefault(here, set()).add(there)
    return graph


def test_no_module_imports_itself_round_a_cycle():
    assert cycles_of(import_graph(group=False)) == set()


def part_of(module: str) -> str:
    """The top-level part a module belongs to: `oncebox.lanes.consumer` -> `lanes`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "oncebox"


def test_every_part_of_the_package_stands_on_a_floor():
    parts = {part_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert sorted(parts - set(LEVEL)) == [], "a new folder or module: put it on a floor (FLOORS)"


def test_imports_only_run_down_the_floors():
    """A concept that imports a lane or the runtime, a store that imports a concept, a lane that
    imports the façade: each is a module on the wrong floor, or one holding another floor's job."""
    offenders = sorted(
        (name, module, f"{FLOOR_OF[part_of(here)]} -> {FLOOR_OF[part_of(module)]}")
        for name, imported in sources().items()
        if (here := module_name(PACKAGE / name)) is not None
        for module in imported
        if LEVEL[part_of(module)] < LEVEL[part_of(here)]
    )
    assert offenders == []


def test_the_parts_of_one_floor_import_each_other_one_way():
    """A ring between two folders of one floor (queue ⇄ outbox, say) means one holds what
    belongs to the other."""
    assert cycles_of(import_graph(group=True)) == set()


def test_at_most_ten_modules_lie_loose_beside_the_folders():
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(loose) <= MOST_LOOSE_MODULES, loose


@pytest.mark.parametrize(
    ("shim", "new"),
    [("oncebox.periods", "oncebox.jobs.periods"), ("oncebox.keyguard", "oncebox.jobs.keyguard")],
)
def test_a_deprecated_module_warns_naming_the_import_that_replaces_it(shim: str, new: str):
    import importlib
    import sys

    sys.modules.pop(shim, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(shim)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{shim} is deprecated: import from {new}"
    ]
    replacement = importlib.import_module(new)
    assert all(getattr(module, name) is getattr(replacement, name) for name in module.__all__)
