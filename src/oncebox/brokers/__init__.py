"""The brokers: one folder per broker, each holding its wire (what oncebox says to it), and where
it has them its consumer's transport and its relay (the outbox channel that publishes to it) —
`rabbitmq/`, `nats/`, `sqs/`. Shared by all of them: the messages they carry (`messages.py`),
what a broker-held queue refuses (`brokered.py`), the consumer's side of any broker
(`transport.py`, behind `queue/transport.py`'s seam) and a relay's connection per thread
(`relay.py`). The claim on the business key carries the guarantee; the broker holds the message."""
