"""The brokers' wires: what oncebox says to a broker (`rabbitmq.py`: an oncebox queue's RabbitMQ
queues, confirmed publishes, acknowledgements), shared by the consumer's transports
(`transports/`) and the channels that publish outbox messages to a broker (`providers/`)."""
