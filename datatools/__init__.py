"""The data line: image tree -> shards + manifest (prepare) -> the stack's data container (transfer) -> readers."""
