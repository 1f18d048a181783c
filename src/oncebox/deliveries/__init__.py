"""What became of a send, from the provider's own record: its signed delivery webhooks
(`api/deliveries.py`), what each event means (`events.py`), and each channel's settings for them
(`reports.py`). Held sends the provider says it took are settled by the resolver lane
(`lanes/resolver.py`)."""
