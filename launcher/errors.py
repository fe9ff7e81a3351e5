class JobError(ValueError):
    """A problem with the job, its inputs or the stack outputs: named, with the fix, before anything runs."""
