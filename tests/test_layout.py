"""The package's layout holds: the façade is used only from above, and imports run one way.

Read from the source with `ast` (imports under `if TYPE_CHECKING:` count too: a type-only import
of the façade is still a lane that knows the façade)."""

from __future__ import annotations

import ast
from pathlib import Path

import oncebox

PACKAGE = Path(oncebox.__file__).parent
# The façade's own users: they sit above `Box` and build on it. `chaos/` is a harness that
# drives whole boxes in worker processes, as `testing` does in one. `status.py` is what the CLI,
# the exporter and the console show of a box; `console/` and `api/` serve it; `contrib/` makes a
# framework's project its box.
FACADE_USERS = (
    "cli/",
    "console/",
    "api/",
    "status.py",
    "testing.py",
    "examples/",
    "integrations/",
    "contrib/",
    "chaos/",
    "__init__.py",
)


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


def test_only_the_facades_own_users_import_the_box():
    offenders = sorted(
        name
        for name, imported in sources().items()
        if "oncebox.box" in imported and name != "box.py" and not name.startswith(FACADE_USERS)
    )
    assert offenders == [], f"modules below the façade import oncebox.box: {offenders}"


def test_the_lanes_and_the_domain_never_import_the_cli_or_the_harnesses():
    above = ("oncebox.cli", "oncebox.chaos", "oncebox.testing", "oncebox.examples")
    below = (
        "jobs/",
        "queue/",
        "outbox/",
        "schedules/",
        "timers/",
        "retention/",
        "lanes/",
        "store/",
    )
    offenders = sorted(
        (name, module)
        for name, imported in sources().items()
        if name.startswith(below)
        for module in imported
        if module.startswith(above)
    )
    assert offenders == []


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
            return parts[1]  # oncebox.lanes.consumer -> queue
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


def test_concept_packages_import_each_other_one_way():
    """A cycle between two concept packages (queue ⇄ outbox, say) means one holds what belongs
    to the other. `runtime/runtime.py` is set aside: it holds every concept's declarations and is
    handed to their lanes, so it sits between them by design."""
    graph = {
        here: {there for there in targets if there != "runtime"}
        for here, targets in import_graph(group=True).items()
        if here != "runtime"
    }
    assert cycles_of(graph) == set()
