"""What a check found: a status, a one-line finding and the fix, printed as one block per check."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "ok", "WARN", "FAIL"


@dataclass(frozen=True)
class Finding:
    status: str  # OK | WARN | FAIL
    check: str  # which check, e.g. "quota gpu-ib"
    message: str
    fix: str = ""

    def render(self) -> str:
        text = f"[{self.status:>4}] {self.check}: {self.message}"
        return text + (f"\n       fix: {self.fix}" if self.fix else "")


def exit_code(findings: list[Finding]) -> int:
    """1 when anything failed (warnings do not fail the run), else 0."""
    return 1 if any(f.status == FAIL for f in findings) else 0


def report(findings: list[Finding], out, printed: bool = False) -> int:
    """printed: the findings are on `out` already (under their stacks' headings); only the summary follows."""
    for f in findings if not printed else ():
        print(f.render(), file=out)
    fails = sum(f.status == FAIL for f in findings)
    warns = sum(f.status == WARN for f in findings)
    print(f"{len(findings)} checks: {fails} failed, {warns} warnings", file=out)
    return exit_code(findings)
