"""What runs the lanes: how a box's lanes are built (`assembly`) and the worker process that runs
them in threads (`worker`). The loop every lane shares is `oncebox.lane`; the lanes themselves
live with the concept they serve (the dispatcher in `outbox/`, the lease rescuer in `queue/`, …)."""
