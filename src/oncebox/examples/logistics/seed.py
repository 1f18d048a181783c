"""Seed data for the freight app: customers, the week's shipments, dock-slot holds. Shared by
`oncebox demo` and `oncebox chaos`, so both run the same workload."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from oncebox import Box
from oncebox.examples.logistics.app import connect, hold_expiry_value

POISON_EMAIL = "dispatch@@broken.example"
CITIES = [
    "Rotterdam",
    "Hamburg",
    "Antwerp",
    "Gdansk",
    "Le Havre",
    "Felixstowe",
    "Genoa",
    "Valencia",
]


def is_active(customer: int) -> bool:
    """Every tenth customer (ids ending in 7) is inactive: eligible for nothing."""
    return customer % 10 != 7


def seed_freight(box: Box, customers: int, period: str, rng: random.Random, at: datetime) -> int:
    """Customers (every tenth inactive, one poison: an address no provider accepts), their
    shipments in `period`, and dock-slot holds around `at` (half already due); returns the
    poison customer's id."""
    postgres = box.store.dialect == "postgres"
    ph = "%s" if postgres else "?"
    conn = connect(box)
    try:
        poison = customers // 2
        for customer in range(1, customers + 1):
            active = 1 if is_active(customer) else 0
            email = POISON_EMAIL if customer == poison else f"ops{customer}@customer.example"
            conn.execute(
                f"INSERT INTO freight_customers (id, name, email, active) VALUES ({ph}, {ph}, "
                f"{ph}, {ph})",
                (customer, f"Customer {customer}", email, active),
            )
            for number in range(rng.randint(0, 4)):
                conn.execute(
                    "INSERT INTO freight_shipments (id, customer_id, week, reference, origin, "
                    f"destination, status) VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, {ph}, {ph})",
                    (
                        customer * 10 + number,
                        customer,
                        period,
                        f"NW-{customer:05d}-{number}",
                        rng.choice(CITIES),
                        rng.choice(CITIES),
                        rng.choice(["delivered", "in transit", "at customs"]),
                    ),
                )
        for hold in range(1, customers // 15 + 2):
            expires = at + timedelta(hours=(-3, -1, 2, 30)[hold % 4])  # half are due
            holder = rng.randint(1, customers)
            holder = holder if holder != poison else holder % customers + 1
            conn.execute(
                "INSERT INTO freight_holds (id, customer_id, dock, state, expires_at) VALUES "
                f"({ph}, {ph}, {ph}, {ph}, {ph})",
                (
                    hold,
                    holder,
                    f"D{rng.randint(1, 12)}",
                    "held",
                    hold_expiry_value(box, expires),
                ),
            )
        conn.commit()
        return poison
    finally:
        conn.close()
