"""A row of the preflight's table, and its statuses."""

from __future__ import annotations

from dataclasses import dataclass

OK, FAIL, SKIP, WARN = "ok", "FAIL", "skip", "warn"  # a warning does not fail the preflight


@dataclass
class Check:
    what: str
    status: str
    detail: str
    remedy: str = ""
