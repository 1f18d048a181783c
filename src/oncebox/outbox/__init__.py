"""The outbox: messages written in the claim's transaction and delivered afterwards — the writer
handlers use, channels and their policies, tokens, rate limits, the state machine
(`transitions.py`), the dispatcher, the delivery rescuer and the ambiguity resolver."""
