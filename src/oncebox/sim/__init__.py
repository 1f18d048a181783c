"""The deterministic simulation: every lane's steps interleaved by a seed, every invariant checked.

The real code of every actor runs against a real store, one actor at a time; a seed fixes which
actor steps next at each store call, which fault fires where, what the providers answer and what
the clock reads — so a failure replays exactly, and shrinks to a shorter run that still fails.
`oncebox sim` runs it; docs/simulation.md says what it covers and what it does not.
"""
