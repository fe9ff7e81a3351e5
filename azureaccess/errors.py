class JobError(ValueError):
    """A problem with the job, its inputs or the stack outputs: named, with the fix, before anything runs."""


def first_line(text: object, limit: int) -> str:
    """The first non-blank line of `text`, cut to `limit` characters: an Azure error's message for one line."""
    line = next((x.strip() for x in str(text).splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."
