"""Durable timers: deadlines kept as rows and swept in transactions (the reservation-hold
pattern), never in-memory timers."""
