"""The one error every tool raises for bad input (the launcher, azurecheck, the data tools), and the one-line form of
an Azure error's message."""


class JobError(ValueError):
    """Bad input to a tool (a job, its options, a stack file or the stack outputs): named, with the fix, before
    anything runs; the commands print it and exit 2."""


def first_line(text: object, limit: int) -> str:
    """The first non-blank line of `text`, cut to `limit` characters: an Azure error's message for one line."""
    line = next((x.strip() for x in str(text).splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."
