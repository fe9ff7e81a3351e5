"""Framework-neutral pieces every payload shares: config, sharding, LR schedule, checkpoints, metrics, and the
shard manifest that datatools/prepare.py writes and the readers check."""
