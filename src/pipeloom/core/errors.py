"""Every error pipeloom raises on purpose, and the :class:`Violation` a validator reports (no torch).

Each message says what is wrong and what is allowed; the CLI prints it as one line.
"""
from __future__ import annotations


class ScheduleError(ValueError):
    """A builder cannot make a schedule for this input (the message says why and what is allowed)."""


class ScheduleFormatError(ValueError):
    """A schedule file or value is malformed."""


class Violation(str):
    """One broken rule of a schedule: the message (a ``str``, so lists of violations print and serialise
    as before) plus what kind of rule it broke, so callers need not recognise messages by their words.

    Kinds: ``shape`` (counts, ranges, devices), ``missing``, ``duplicate``, ``order`` (a job before one it
    needs on its own device), ``overlap`` (a bad overlapped pair), ``deadlock``, ``memory`` (peak above
    the limit).
    """

    __slots__ = ("kind",)
    KINDS = ("shape", "missing", "duplicate", "order", "overlap", "deadlock", "memory")

    def __new__(cls, kind: str, message: str) -> "Violation":
        if kind not in cls.KINDS:
            raise ValueError(f"unknown violation kind {kind!r}; one of {', '.join(cls.KINDS)}")
        self = super().__new__(cls, message)
        self.kind = kind
        return self

    @property
    def structural(self) -> bool:
        """True when the schedule is not even a complete set of jobs on the right devices (it cannot be timed)."""
        return self.kind in ("shape", "missing", "duplicate")


class ValidationError(ValueError):
    """A schedule broke rules; ``violations`` lists every one (:class:`Violation`)."""

    def __init__(self, violations: list[str]):
        self.violations = violations
        head = violations[0] if violations else "invalid schedule"
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        super().__init__(head + more)


class DeadlockError(RuntimeError):
    """Devices executing their lists in order block each other (or a dependency never runs)."""

    def __init__(self, message: str, stuck: list[tuple[int, int, str, str]]):
        super().__init__(message)
        self.stuck = stuck  # (device, index, job, what it waits for)
