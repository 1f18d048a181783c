"""Broker transports behind the consumer's seam (`queue/transport.py`): the broker holds the
message, and the claim on the business key carries the guarantee. `rabbitmq.py`: RabbitMQ's
(its wire is `brokers/rabbitmq.py`)."""
