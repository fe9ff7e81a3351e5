"""Checks against a real Azure subscription: `python -m launcher preflight` before `pulumi up` (and, for the
quota part, before each submission), `python -m launcher doctor` after it. One module per concern; each check
returns Findings (findings.py) that name the problem and the fix, never raises for what Azure answers."""
