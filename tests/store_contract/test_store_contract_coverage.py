"""The contract covers the whole protocol: every operation of `Store`, `ConsumerSession` and
`ConsumerTx` is called directly — `store.<op>(`, `session.<op>(`, `tx.<op>(` (a property: read)
— by at least one test of this folder, so it runs on every store. An operation added to the
protocol fails this test until a contract test calls it and checks what it did."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from oncebox.store.protocol import ConsumerSession, ConsumerTx, Store

CONTRACT = Path(__file__).resolve().parent
PROTOCOLS: dict[str, type] = {"store": Store, "session": ConsumerSession, "tx": ConsumerTx}


def operations(protocol: type) -> dict[str, bool]:
    """The protocol's operations, each with whether it is a property (read, not called); plain
    attributes (`url`, a session's `dialect`) are data, not operations."""
    return {
        name: isinstance(member, property)
        for name, member in vars(protocol).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    }


def receiver_name(node: ast.expr) -> str | None:
    """`store` for `store.x` and `box.store.x`, `session` for `consumer.session.x`, …"""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def used_directly() -> dict[str, dict[str, set[str]]]:
    """Per receiver name: the attributes called on it, and those only read, in the tests."""
    used: dict[str, dict[str, set[str]]] = {
        name: {"called": set(), "read": set()} for name in PROTOCOLS
    }
    for path in sorted(CONTRACT.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and receiver_name(node.value) in used:
                way = "called" if id(node) in called else "read"
                used[receiver_name(node.value) or ""][way].add(node.attr)
    return used


def test_the_protocols_operations_are_found():
    """The introspection below sees the protocols as they are written (a guard for the guard)."""
    store, session, tx = (operations(p) for p in PROTOCOLS.values())
    assert {"job_insert": False, "dialect": True, "close": False}.items() <= store.items()
    assert "url" not in store and len(store) >= 60
    assert set(session) == {"job_lease", "job_release", "due_seen", "transaction", "close"}
    assert {"intent_claim", "job_finish", "handler_scope", "outbox_insert"} <= set(tx)


def test_every_store_operation_is_called_directly_by_a_contract_test():
    used = used_directly()
    missing = [
        f"{protocol.__name__}.{name}"
        for receiver, protocol in PROTOCOLS.items()
        for name, is_property in sorted(operations(protocol).items())
        if name not in used[receiver]["read" if is_property else "called"]
    ]
    assert missing == [], (
        f"{len(missing)} operation(s) never called directly by a test in {CONTRACT.name}/ "
        f"(as store.<op>(...), session.<op>(...) or tx.<op>(...)): {', '.join(missing)}; add a "
        "test that calls each and checks its result and its effect, read back through another "
        "operation"
    )
