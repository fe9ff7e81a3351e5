class ConfigError(ValueError):
    """Bad input (command line, data, checkpoint): the message names the problem and the fix."""


class InputFault(Exception):
    """The input pipeline broke under the run (a decode worker died): not the configuration, not the replicas."""


class ReplicaFault(Exception):
    """The data-parallel replicas went wrong and rolling back did not hold (payloads/pytorch/sentinel.py)."""


def say(line: str, stream=None) -> None:
    """Writes one whole line to stderr (or `stream`) in a single write. Every rank of a job shares one pipe, and
    print() writes the text and its newline separately, so two ranks' lines could run together on one line.
    A pipe keeps writes of up to PIPE_BUF (4096) bytes whole."""
    import os
    import sys

    stream = stream or sys.stderr
    stream.flush()
    data = (line.rstrip("\n") + "\n").encode(getattr(stream, "encoding", None) or "utf-8", "replace")
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # pytest's capture, StringIO: no descriptor
        stream.write(data.decode("utf-8", "replace"))
        stream.flush()
        return
    while data:
        data = data[os.write(fd, data) :]
