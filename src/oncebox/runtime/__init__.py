"""What the façade and the lanes share: the `Runtime` every lane is handed (`runtime.py`), and the
verbs that take it — enqueue (`enqueue.py`), a schedule's fan-out and trigger (`fanout.py`,
`trigger.py`), the operator's actions (`operations.py`). Concept folders import none of this."""
