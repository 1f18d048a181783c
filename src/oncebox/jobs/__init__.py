"""Jobs: what a task is and what it promises — the task registry, business keys and their
templates, periods, the argument codec, retry policies, the key-drift guard, a key's receipt
chain (`receipts.py`), the dead letters an operator acts on in bulk (`dead_letters.py`) and the
job state machine (`transitions.py`).
Nothing here touches a lane; the queue and the outbox build on it."""
