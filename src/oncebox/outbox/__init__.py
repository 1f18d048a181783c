"""The outbox: messages written in the claim's transaction and delivered afterwards — the writer
handlers use, channels and their policies, tokens, rate limits, what a row says to its provider
(`outgoing.py`) and the state machine (`transitions.py`). Its lanes — the dispatcher, the delivery
rescuer and the ambiguity resolver — are in `lanes/`."""
