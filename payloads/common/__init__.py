"""Framework-neutral pieces every payload shares: config, sharding, LR schedule, checkpoints, metrics."""
