"""Every payload's entry point ends the same way: its log lines on stdout, a configuration or data error as one
line and exit code 2, a SIGTERM's stop (preemption.py) as its line and exit code 75, otherwise 0."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from . import preemption
from .errors import ConfigError, say

CONFIG_ERROR = 2


def run_main(body: Callable[[], object]) -> int:
    """Run `body` (parse, then train) and turn its ending into the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        body()
    except ConfigError as e:
        say(f"error: {e}")  # every rank says it: a data error may be met by one rank only
        return CONFIG_ERROR
    except preemption.Stopped as e:
        say(str(e))  # every rank says it: all stopped at the same step
        return preemption.EXIT_CODE
    return 0
