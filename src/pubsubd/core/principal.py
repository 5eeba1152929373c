"""Who is calling: the principal a call runs as, shared by authentication and authorization.

Authentication (the bearer token on gRPC metadata or HTTP ``Authorization``) decides who the
caller is and sets :data:`CALLER` for the duration of the call; authorization (IAM policies)
reads it. Both are off by default (``make run``, like Google's emulator): then nothing sets
:data:`CALLER` and :func:`caller` answers :data:`ANONYMOUS`.

Principals are written as IAM members are (``user:alice@example.com``,
``serviceAccount:ingest@proj.iam.gserviceaccount.com``), so a policy binding names them as
Google's do. A token's subject without a ``kind:`` prefix is a ``user:``.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["ANONYMOUS", "CALLER", "CALLER_UNTIL", "Principal", "caller"]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated (or anonymous) caller, as an IAM member string."""

    member: str

    @classmethod
    def from_subject(cls, subject: str) -> Principal:
        """The principal of a token subject: ``alice@example.com`` is ``user:alice@example.com``."""
        return cls(subject if ":" in subject else f"user:{subject}")

    @property
    def anonymous(self) -> bool:
        return self.member == ANONYMOUS.member


ANONYMOUS = Principal("allUsers")
"""The caller of a call that carried no credentials (IAM's ``allUsers``)."""

CALLER: ContextVar[Principal | None] = ContextVar("pubsubd_caller", default=None)
"""Set by authentication around each call's handler; read by authorization."""


CALLER_UNTIL: ContextVar[float] = ContextVar("pubsubd_caller_until", default=float("inf"))
"""When the current call's token expires (wall clock, its ``exp``; ``inf``: never, or no
token): set by authentication beside :data:`CALLER`, read by a long stream that must not outlive
its token (a storage node's AppendStream)."""


def caller() -> Principal:
    """The principal the current call runs as (:data:`ANONYMOUS` when nobody set one)."""
    return CALLER.get() or ANONYMOUS
