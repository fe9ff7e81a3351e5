"""`python -m payloads.healthcheck`: the check (run.py), ended the way every payload ends (common/entry.py)."""

from ..common import entry
from .run import main

entry.finish(main())
