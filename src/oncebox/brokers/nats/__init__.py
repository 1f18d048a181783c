"""NATS JetStream: its wire (`wire.py`), read by the consumer through `brokers/transport.py`."""
