"""Jobs: what a task is and what it promises — the task registry, business keys and their
templates, periods, the argument codec, retry policies, the key-drift guard, and the context a
handler receives. Nothing here touches a lane; the queue and the outbox build on it."""
