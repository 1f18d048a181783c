"""Real servers that behave like the outside world, for tests and the failure-injection harness.

- `SmtpSink`: an SMTP server on loopback (aiosmtpd) that records what it received and replies as
  scripted: accept, 4xx/5xx replies, or accept-then-drop-the-connection (the lost acknowledgement);
  on request with STARTTLS or implicit TLS, a login (recorded in `logins`), or another address.
- `FakeEmailApi`: an HTTP email API with idempotency keys, modelled on Resend: it stores the first
  response per key and replays it, answers 409 while a key is in flight or reused with another
  body, and can be scripted to throttle (429 + Retry-After), fail (5xx), or accept and then time
  out or reset the connection. It answers lookups (`GET /emails/{id}`, `GET
  /emails?message_id=`) and, with `send_webhooks(url, secret)`, emits Resend's delivery webhooks
  (Svix-signed; duplicated, reordered, forged or stale on request) from `provider_webhooks`.
- `WebhookReceiver`: a webhook endpoint that checks each request's signature with
  `verify_webhook`, records what it received, and answers as scripted (statuses, Retry-After,
  redirects, accept-then-time-out); with `dedupe=True` it processes each webhook-id once.

The two HTTP ones share their life cycle (`loopback.LoopbackServer`: a threaded server on
loopback, `start` / `stop`, a context manager). They are real parts — a real socket, a real
protocol — so the providers' own code paths (smtplib, httpx2) are what the tests exercise.
aiosmtpd is needed for `SmtpSink` (`pip install aiosmtpd`).
"""
