-- Each job and outbox row keeps the trace context it was written in (the W3C `traceparent` and
-- `tracestate` as the configured propagator wrote them, a JSON object; NULL when no span was
-- current), so a web request, the job it enqueued and the email that job wrote form one trace
-- (oncebox/kernel/tracing.py). A column of its own, never the arguments: they feed keys and signature
-- checks, and a trace id there would make every enqueue a new business operation. Nullable
-- without a default: PostgreSQL adds it without rewriting the table, and the previous release's
-- workers, which never name it, write and read rows as before.
ALTER TABLE __S__.oncebox_jobs ADD COLUMN trace_context text;
ALTER TABLE __S__.oncebox_outbox ADD COLUMN trace_context text;
