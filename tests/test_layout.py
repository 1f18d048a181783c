"""The package's layout holds: seven floors, imports only downward, one way within a floor.

    surfaces  cli/ console/ api/ contrib/ chaos/ sim/ examples/ fakes/ testing status shapes
              alembic
    façade    box aio
    lanes     lanes/           every loop that runs, one file each
    runtime   runtime/         the Runtime and the verbs that take it (enqueue, fan-out, trigger)
    concepts  jobs/ queue/ outbox/ schedules/ timers/ retention/ deliveries/ limits/ providers/
              brokers/         declarations, rules and state machines
    store     store/           the Store protocol, its parameters and rows, both stores
    kernel    kernel/          the clock, errors, logs, metrics: what every floor may use

A module imports from its own floor or below, never above; the folders of one floor import each
other one way (no ring). Every lane — `lanes/` but its loop, its builder and the worker — has one
shape (a `...Config`, a `...Result`, `run_once()`, `run_forever(stop)`), is built only in
`lanes/assembly.py` and imports no other lane (the lease rescuer's call into the delivery rescuer
excepted). A provider is reached only through `providers/registry.py`, and asked what it can do only
through its declaration (`providers/base.py`'s `capabilities_of`). Read from the source with `ast`
(imports under `if TYPE_CHECKING:` count too: a type-only import of the façade is still a lane that
knows the façade), so the rules need no import of the package's optional parts."""

from __future__ import annotations

import ast
import warnings
from functools import cache
from pathlib import Path

import pytest

import oncebox
from oncebox.providers.registry import PROVIDERS

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
        "sim",
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


# -- the lanes: one room, one shape, built in one place ------------------------------------

LANES = PACKAGE / "lanes"
NOT_LANES = {"__init__", "lane", "assembly", "worker"}  # the loop, the builder, the process
BUILDER = LANES / "assembly.py"
ALLOWED_IMPORTS = {("lease_rescuer", "delivery_rescuer")}  # its round rescues the outbox too


def lane_modules() -> dict[str, ast.Module]:
    modules = {
        path.stem: ast.parse(path.read_text("utf-8"))
        for path in sorted(LANES.glob("*.py"))
        if path.stem not in NOT_LANES
    }
    assert len(modules) >= 10, f"the lanes are not where this test looks: {sorted(modules)}"
    return modules


def classes(tree: ast.Module) -> list[ast.ClassDef]:
    return [node for node in tree.body if isinstance(node, ast.ClassDef)]


def is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name) and target.id == "dataclass":
            return True
    return False


def methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}


def annotation(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node)


def lane_classes() -> dict[str, str]:
    """Each class of a lane module that has a `run_once`, with its module."""
    return {
        node.name: module
        for module, tree in lane_modules().items()
        for node in classes(tree)
        if "run_once" in methods(node)
    }


def shape_problems(module: str, tree: ast.Module) -> list[str]:
    found = classes(tree)
    configs = [c.name for c in found if c.name.endswith("Config") and is_dataclass(c)]
    results = {c.name for c in found if c.name.endswith("Result") and is_dataclass(c)}
    problems = []
    if not configs:
        problems.append(f"{module}: no ...Config dataclass")
    if not results:
        problems.append(f"{module}: no ...Result dataclass")
    lanes = [c for c in found if "run_once" in methods(c)]
    if not lanes:
        problems.append(f"{module}: no class with run_once")
    for lane in lanes:
        run_once = methods(lane)["run_once"]
        returns = annotation(run_once.returns)
        if [a.arg for a in run_once.args.args] != ["self"] or returns not in results:
            problems.append(
                f"{module}.{lane.name}.run_once: wants (self) -> one of {sorted(results)}, "
                f"is ({', '.join(a.arg for a in run_once.args.args)}) -> {returns}"
            )
        run_forever = methods(lane).get("run_forever")
        if run_forever is None:
            problems.append(f"{module}.{lane.name}: no run_forever")
            continue
        params = [a.arg for a in run_forever.args.args]
        stop = annotation(run_forever.args.args[1].annotation) if len(params) == 2 else None
        if params != ["self", "stop"] or stop != "threading.Event":
            problems.append(
                f"{module}.{lane.name}.run_forever: wants (self, stop: threading.Event), "
                f"is ({', '.join(params)}) with stop: {stop}"
            )
        elif annotation(run_forever.returns) != "None":
            problems.append(f"{module}.{lane.name}.run_forever: wants -> None")
    return problems


def test_every_lane_has_a_config_a_result_run_once_and_run_forever():
    problems = [
        problem
        for module, tree in lane_modules().items()
        for problem in shape_problems(module, tree)
    ]
    assert problems == [], "lanes out of shape:\n" + "\n".join(problems)


def test_only_the_assembly_builds_a_lane():
    lanes = lane_classes()
    assert {"Consumer", "OutboxDispatcher", "LeaseRescuer", "Pruner"} <= set(lanes), lanes
    builds = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == BUILDER:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            if name in lanes or name == "for_runtime":
                builds.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(func)}(…)")
    assert builds == [], "lanes built outside lanes/assembly.py:\n" + "\n".join(builds)


def lanes_imported(module: str, tree: ast.Module) -> set[str]:
    """The modules of `lanes/` that the lane `module` imports (under TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("oncebox.lanes."):
                    found.add(alias.name.split(".")[2])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:  # a relative import: lanes/ itself
                parts = (node.module or "").split(".")
                package = ["oncebox", "lanes", *[p for p in parts if p]]
            elif node.level == 0 and node.module:
                package = node.module.split(".")
            else:
                continue
            if package[:2] != ["oncebox", "lanes"]:
                continue
            if len(package) > 2:
                found.add(package[2])
            else:  # `from oncebox.lanes import dispatcher`
                found |= {alias.name for alias in node.names}
    found.discard(module)
    return found


def test_no_lane_imports_another():
    offenders = sorted(
        f"{module} imports lanes.{other}"
        for module, tree in lane_modules().items()
        for other in lanes_imported(module, tree)
        if other != "lane" and (module, other) not in ALLOWED_IMPORTS
    )
    assert offenders == [], (
        "a lane imports another lane (or the assembly or worker):\n" + "\n".join(offenders)
    )


# -- the providers: reached through the registry, asked through their declaration ----------

REGISTRY = "providers/registry.py"
THE_ONE_PLACE = "providers/base.py"  # `capabilities_of`: the declaration, or the methods


def implementation_modules() -> set[str]:
    """The modules the registry's entries name: a provider implementation each."""
    return {entry.module for entry in PROVIDERS.values()}


@cache
def parsed_sources() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text("utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def names_imported(tree: ast.Module) -> set[str]:
    """Every module an import statement names, wherever it stands (in a function too), and every
    string that names one (`importlib.import_module("…")`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def test_no_module_but_the_registry_reaches_a_provider_implementation():
    implementations = implementation_modules()
    assert "oncebox.brokers.rabbitmq.relay" in implementations
    offenders = sorted(
        (name, module)
        for name, tree in parsed_sources().items()
        if name != REGISTRY
        for module in names_imported(tree) & implementations
    )
    assert offenders == [], f"provider implementations reached around the registry: {offenders}"


def protocols_of_base() -> set[str]:
    """The protocols `providers/base.py` defines (`Provider`, `StatusLookup`, …)."""
    tree = ast.parse((PACKAGE / THE_ONE_PLACE).read_text("utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(base) == "Protocol" for base in node.bases)
    }


# What only a provider is asked for; `close` is asked of a provider when the object is one by
# name (a broker transport's own `close` is no provider's).
PROVIDER_ONLY = {"send_batch", "status", "lookup_lag", "check_payload", "capabilities"}


def probes(tree: ast.Module, protocols: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        call = node.func.id
        if call in ("hasattr", "getattr") and len(node.args) >= 2:
            target, attribute = node.args[0], node.args[1]
            if not (isinstance(attribute, ast.Constant) and isinstance(attribute.value, str)):
                continue
            named = ast.unparse(target)
            if attribute.value in PROVIDER_ONLY or (
                attribute.value == "close" and ("provider" in named or "inner" in named)
            ):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif call == "isinstance" and len(node.args) == 2:
            names = {
                part.split(".")[-1] for part in ast.unparse(node.args[1]).strip("()").split(", ")
            }
            if names & protocols:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_but_base_probes_a_provider_for_what_it_can_do():
    protocols = protocols_of_base()
    assert {"Provider", "StatusLookup"} <= protocols
    offenders = {
        name: found
        for name, tree in parsed_sources().items()
        if name != THE_ONE_PLACE and (found := probes(tree, protocols))
    }
    assert offenders == {}, f"read the declaration (`capabilities_of`) instead: {offenders}"
