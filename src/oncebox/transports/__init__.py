"""Broker transports behind the consumer's seam (`queue/transport.py`): the broker holds the
message, the store keeps the job's record, and the claim on the business key carries the
guarantee. `rabbitmq.py`: RabbitMQ's queues, confirms and acknowledgements."""
