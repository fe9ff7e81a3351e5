"""A file system where rename raises, for every Python process started with this folder on PYTHONPATH (site
imports sitecustomize at start-up): os.rename, os.replace and os.renames (and so pathlib's rename/replace and
shutil.move's first try) raise OSError(EXDEV) for any path under $NO_RENAME_UNDER, as a mount without rename
could. Each process that loads it leaves a file named for its pid in $NO_RENAME_LOG holding its command line,
so a test can show the hook was live in the processes it ran."""

import errno
import os
import sys

_ROOT = os.environ.get("NO_RENAME_UNDER")


def _under(path) -> bool:
    try:
        return os.path.abspath(os.fsdecode(path)).startswith(os.path.abspath(_ROOT) + os.sep)
    except TypeError:  # a file descriptor
        return False


def _refusing(real):
    def refuse(src, dst, *args, **kwargs):
        if _under(src) or _under(dst):
            raise OSError(errno.EXDEV, f"rename is not supported on this file system (tests/no_rename): {src} -> {dst}")
        return real(src, dst, *args, **kwargs)

    return refuse


if _ROOT:
    os.rename, os.replace, os.renames = _refusing(os.rename), _refusing(os.replace), _refusing(os.renames)
    if os.environ.get("NO_RENAME_LOG"):
        with open(os.path.join(os.environ["NO_RENAME_LOG"], str(os.getpid())), "w") as f:
            f.write(" ".join(sys.orig_argv))
