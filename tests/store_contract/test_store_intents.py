"""Intents, operation by operation, on every store: one durable intent per key, claimed in the
consumer transaction beside the handler's own writes, released with a failed handler, pruned
only by an explicit policy."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncebox.kernel.errors import TransactionControlRefused
from oncebox.store.params import IntentClaim
from oncebox.store.protocol import Store
from oncebox.store.records import IntentRow
from support.contract import T0, advance, insert, opened_session


def test_intent_claim_claims_each_key_once_ever(store: Store):
    job_id = insert(store, "k/1")
    with opened_session(store) as session:
        with session.transaction() as tx:
            claimed = tx.intent_claim(
                [IntentClaim("k/1", "t", job_id), IntentClaim("k/2", "t", None)]
            )
            assert claimed == {"k/1", "k/2"}
        advance(store, timedelta(days=30))
        with session.transaction() as tx:
            again = tx.intent_claim([IntentClaim("k/1", "t", 99), IntentClaim("k/3", "u", None)])
            assert again == {"k/3"}
    assert store.intent_get("k/1") == IntentRow("k/1", "t", job_id, T0)
    assert store.intent_get("k/3") == IntentRow("k/3", "u", None, T0 + timedelta(days=30))
    assert store.intent_get("k/unclaimed") is None
    assert store.intent_count() == 3


def test_intent_owners_names_the_job_that_claimed_each_claimed_key(store: Store):
    job_id = insert(store, "k/1")
    with opened_session(store) as session:
        with session.transaction() as tx:
            tx.intent_claim([IntentClaim("k/1", "t", job_id), IntentClaim("k/2", "t", None)])
        with session.transaction() as tx:
            owners = tx.intent_owners(["k/1", "k/2", "k/free"])
            assert owners == {"k/1": job_id, "k/2": None}
            assert tx.intent_owners([]) == {}
    assert store.intent_count() == 2  # reading owners claims nothing


def test_intent_release_undoes_claims_of_the_same_transaction(store: Store):
    with opened_session(store) as session, session.transaction() as tx:
        assert tx.intent_claim([IntentClaim("k/1", "t", None), IntentClaim("k/2", "t", None)]) == {
            "k/1",
            "k/2",
        }
        tx.intent_release(["k/2"])  # its handler failed
        assert tx.intent_owners(["k/1", "k/2"]) == {"k/1": None}
    assert store.intent_get("k/2") is None
    assert store.intent_get("k/1") is not None
    assert store.intent_count() == 1


def test_a_handlers_writes_commit_with_the_claim_and_a_failed_handlers_are_undone(store: Store):
    """The handler scope is a savepoint on the claim's connection: a handler that raises loses
    its own writes, the transaction (and the other handlers' writes) commits."""
    with opened_session(store) as session, session.transaction() as tx:
        tx.intent_claim([IntentClaim("k/1", "t", None), IntentClaim("k/2", "t", None)])
        with tx.handler_scope() as connection:
            connection.execute(
                "INSERT INTO oncebox_settings (name, value) VALUES ('written-by-1', 'kept')"
            )
        with pytest.raises(RuntimeError, match="handler 2 failed"), tx.handler_scope() as failing:
            failing.execute(
                "INSERT INTO oncebox_settings (name, value) VALUES ('written-by-2', 'undone')"
            )
            raise RuntimeError("handler 2 failed")
        tx.intent_release(["k/2"])
    assert store.setting_get("written-by-1") == "kept"
    assert store.setting_get("written-by-2") is None
    assert (store.intent_get("k/1") is not None, store.intent_get("k/2")) == (True, None)


def test_a_handler_scope_refuses_to_commit_the_claims_connection(store: Store):
    with (
        opened_session(store) as session,
        pytest.raises(TransactionControlRefused),
        session.transaction() as tx,
    ):
        tx.intent_claim([IntentClaim("k/1", "t", None)])
        with tx.handler_scope() as connection:
            connection.commit()
    assert store.intent_get("k/1") is None  # the whole transaction rolled back
    assert store.intent_count() == 0


def test_prune_of_intents_deletes_a_tasks_intents_older_than_asked_oldest_first(store: Store):
    def claim(key: str, task: str) -> None:
        with opened_session(store) as session, session.transaction() as tx:
            tx.intent_claim([IntentClaim(key, task, None)])

    claim("k/oldest", "t")
    advance(store, timedelta(days=1))
    claim("k/old", "t")
    claim("k/other-task", "u")
    advance(store, timedelta(days=400))
    claim("k/young", "t")
    assert store.prune_names("intents") == ["t", "u"]
    assert store.prune("intents", "t", timedelta(days=365), limit=1) == 1
    assert store.intent_get("k/oldest") is None
    assert store.intent_get("k/old") is not None
    assert store.prune("intents", "t", timedelta(days=365), limit=10) == 1
    assert store.prune("intents", "t", timedelta(days=365), limit=10) == 0
    assert sorted(k for k in ("k/old", "k/other-task", "k/young") if store.intent_get(k)) == [
        "k/other-task",
        "k/young",
    ]
    assert store.intent_count() == 2
