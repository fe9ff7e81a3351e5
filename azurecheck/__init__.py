"""Checks against a real Azure subscription, a tool of its own beside the launcher: `python -m azurecheck preflight`
(or `python -m launcher preflight`) before `pulumi up`, `python -m azurecheck doctor` after it; the launcher runs
the quota part before each submission. One module per concern; each check
returns Findings (findings.py) that name the problem and the fix, never raises for what Azure answers."""
