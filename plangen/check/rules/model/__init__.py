"""Level 2's rules: the plan against the model on the meta device, then through a shrunk model (PG2xx)."""
