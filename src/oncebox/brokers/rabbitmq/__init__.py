"""RabbitMQ: its wire (`wire.py`: an oncebox queue's RabbitMQ queues, confirmed publishes,
acknowledgements), the consumer's transport on it (`transport.py`) and the relay channel that
publishes outbox messages to it (`relay.py`, `amqp://…?queue=NAME`)."""
