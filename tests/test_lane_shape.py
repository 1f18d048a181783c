"""Every loop that runs lives in `lanes/`, one file each, one shape, built in one place.

Read from the source with `ast`: each lane module holds a `...Config` and a `...Result`
dataclass and a lane class with `run_once(self) -> <its Result>` and `run_forever(self, stop)`;
nothing in oncebox but `lanes/assembly.py` builds a lane (tests may); and no lane imports another
— of `lanes/` a lane imports only `lane.py`, the loop they share, save the one call the lease
rescuer makes into the delivery rescuer, in the same round."""

from __future__ import annotations

import ast
from pathlib import Path

import oncebox

PACKAGE = Path(oncebox.__file__).parent
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
