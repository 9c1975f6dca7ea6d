"""The audit's report: each check made (its family, ok / failed / not checked, and what was checked or wrong) and
the summary the command prints. Every other module of the auditor writes into it; it depends on none of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OK = "ok"
FAILED = "failed"
NOT_CHECKED = "not checked"


@dataclass(frozen=True)
class Check:
    """One check: its family (``input``, ``key``, ``signature``, ``consistency``, ``roots``, ``entries``,
    ``receipt``, ``anchor``, ``state``), ``ok``/``failed``/``not checked``, and what was checked or wrong."""

    family: str
    status: str
    message: str

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def line(self) -> str:
        label = {OK: "ok", FAILED: "FAILED", NOT_CHECKED: "--"}.get(self.status, self.status)
        return f"{label:<7} {self.family:<12} {self.message}"


@dataclass
class AuditReport:
    """Every check made, in order. ``state`` is what to save for the next audit: set only when ``ok``."""

    checks: list[Check] = field(default_factory=list)
    state: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.failed]

    def family(self, name: str) -> list[Check]:
        return [c for c in self.checks if c.family == name]

    def summary(self) -> str:
        counts = {status: sum(c.status == status for c in self.checks) for status in (OK, FAILED, NOT_CHECKED)}
        verdict = "PASSED" if self.ok else "FAILED"
        return (
            f"audit {verdict}: {counts[OK]} ok, {counts[FAILED]} failed, {counts[NOT_CHECKED]} not checked"
            f" ({len(self.checks)} checks)"
        )

    def text(self) -> str:
        return "\n".join([*(c.line() for c in self.checks), self.summary()])
