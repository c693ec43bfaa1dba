"""Level 1's rules: read from the plan file's source with libcst, never run, no torch (PG0xx, PG1xx)."""
