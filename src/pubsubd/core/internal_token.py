"""The bearer token a process's own calls to the cluster's forwarders and storage nodes carry:
authentication inside a cluster.

Rules:

1. A forwarder or a storage node with authentication on (``--auth-*``) checks every call's
   token, whoever makes it. A forwarder's callers are clients (directly, or through a frontend
   that passes the client's token on with the call, and gives an unsent Pull response back
   with it too) and the other
   forwarders, which call it on their own behalf: dead letters and SLI events published to a
   topic it owns, and the ``pubsubd.internal.v1.Sources`` calls of a subscription read on a
   copy. Those carry the token of ``--internal-token-file`` (:data:`INTERNAL_TOKEN`), as do
   every call and append-port connection of a writer (``serve --cluster``, forwarders, their
   auditor) to a storage node (``storage/node_client.py``, ``storage/append_link.py``).
2. The token is an ordinary one (``pubsubd tokens create``, or a static token), checked by the
   same verifier as a client's; its subject is the cluster's own identity. A forwarder verifies
   its own internal token at start-up and lets that principal past IAM (it publishes dead
   letters as Google's service agent does), so the token is a cluster secret: whoever holds it
   may make any call.
3. The file is read again when it changes (its modification time), so a token can be replaced
   without a restart; a file that cannot be read keeps the last token read.
4. Like ``core.tls.INTERNAL``, it is one process setting, configured once at start-up by the
   composition root before anything calls out.
5. The token's principal is the cluster's identity (:class:`InternalIdentity`, read with the
   process's own verifier). A forwarder lets it past IAM and lets *only* it call its internal
   methods (every ``pubsubd.internal.v1`` method but Identify, open to anyone, and GiveBack, a
   client's own call: :func:`internal_only`); a storage node lets only it call at all
   (:func:`require_internal`: any other valid token, a client's or an admin's, is refused
   PERMISSION_DENIED on gRPC and on the append port).
6. The identity follows the file as the token does (rule 3): when the file changes, the new
   token's principal replaces the old one, which stays accepted for a grace period
   (``--internal-token-grace``, :data:`DEFAULT_GRACE_S`; 0: none) and is refused from then on
   (rotation to another subject across machines: a process whose file has not changed yet
   still calls with the old token; after the grace, the append connections and AppendStreams
   of the old one are ended, and their writers reconnect with the token now in their file).
   A file that cannot be read, or holds a token this process refuses, keeps the last identity
   (and is logged). :class:`Succession` is the pure rule, over a clock it is given.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path

from pubsubd.core.errors import NotInternalCaller, Unauthenticated
from pubsubd.core.principal import Principal
from pubsubd.core.tokens import TokenVerifier

__all__ = [
    "CLIENT_METHODS",
    "DEFAULT_GRACE_S",
    "INTERNAL_TOKEN",
    "InternalIdentity",
    "InternalToken",
    "Succession",
    "internal_only",
    "internal_principal",
    "read_token",
    "require_internal",
]

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]

INTERNAL_SERVICES = "/pubsubd.internal.v1."
# Internal methods a client's own calls make, with the client's token (checked by IAM as a
# Pull): a frontend's or a REST front's give-back of a Pull response its client never got.
CLIENT_METHODS = frozenset({"/pubsubd.internal.v1.Forwarder/GiveBack"})
# Methods anyone may call: who serves at this address (api/grpc/liveness.py).
OPEN_METHODS = frozenset({"/pubsubd.internal.v1.Forwarder/Identify"})
# How often the identity looks at its file again, at most (a stat per append frame otherwise).
RECHECK_S = 0.25
# How long a replaced identity stays accepted after the file names another (rule 6).
DEFAULT_GRACE_S = 60.0


def internal_only(method: str) -> bool:
    """Whether only the cluster's identity may call ``method`` on a forwarder (rule 5)."""
    return (
        method.startswith(INTERNAL_SERVICES)
        and method not in CLIENT_METHODS
        and method not in OPEN_METHODS
    )


def read_token(path: Path) -> str:
    """The token in ``path`` (surrounding whitespace dropped); ValueError when there is none."""
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise ValueError(f"token file {path}: {e.strerror or e}") from None
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def internal_principal(verifier: TokenVerifier, path: Path) -> Principal:
    """The cluster's identity: the principal of the internal token in ``path`` as ``verifier``
    (the process's own settings) reads it. ValueError: no token there, or one it refuses."""
    try:
        return verifier.verify(read_token(path))
    except Unauthenticated as e:
        raise ValueError(
            f"--internal-token-file: this process refuses its own token ({e})"
        ) from None


def require_internal(principal: Principal, internal: Collection[Principal], service: str) -> None:
    """Let only the cluster's own identity (``internal``) call ``service``; raises
    NotInternalCaller (PERMISSION_DENIED) for any other principal."""
    if principal not in internal:
        raise NotInternalCaller(principal.member, service)


def _stamp(path: Path) -> tuple[int, int, int]:
    """What tells that a file changed: its modification time, inode and size."""
    st = os.stat(path)
    return st.st_mtime_ns, st.st_ino, st.st_size


class Succession:
    """Rule 6, pure: the identity now and the ones it replaced, each accepted until its grace
    ends (monotonic seconds the caller gives)."""

    __slots__ = ("_previous", "current", "grace_s")

    def __init__(self, current: Principal | None, grace_s: float = DEFAULT_GRACE_S) -> None:
        if grace_s < 0:
            raise ValueError(f"the internal token grace must not be negative, got {grace_s}")
        self.current = current
        self.grace_s = grace_s
        self._previous: dict[Principal, float] = {}  # a replaced identity -> accepted until

    def follow(self, principal: Principal, now: float) -> bool:
        """The file names ``principal`` now; True if that replaced the current identity (which
        stays accepted for the grace)."""
        if principal == self.current:
            return False
        self._previous.pop(principal, None)  # back to an earlier one: it is current again
        if self.current is not None and self.grace_s > 0:
            self._previous[self.current] = now + self.grace_s
        self.current = principal
        return True

    def principals(self, now: float) -> frozenset[Principal]:
        """Who is accepted at ``now``: the current identity, and replaced ones in their grace."""
        for principal, until in list(self._previous.items()):
            if now >= until:
                del self._previous[principal]
        held = set(self._previous)
        if self.current is not None:
            held.add(self.current)
        return frozenset(held)


class InternalIdentity:
    """The cluster's identity as this process reads it (rules 5, 6): the principal of the token
    in ``path``, read again when the file changes, and the one it replaced during its grace.
    ``path`` None: nobody (authentication on without an internal token: no process of a
    cluster calls this one)."""

    def __init__(
        self,
        verifier: TokenVerifier,
        path: Path | None,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Reads the token now: ValueError (no token, or one ``verifier`` refuses)."""
        self.verifier = verifier
        self.path = path
        self._clock = clock
        self._succession = Succession(None, grace_s)
        self._principals: frozenset[Principal] = frozenset()
        self._stamp: tuple[int, int, int] | None = None
        self._looked_at = clock()
        if path is not None:
            self._succession.follow(internal_principal(verifier, path), self._looked_at)
            self._principals = self._succession.principals(self._looked_at)
            self._stamp = _stamp(path)

    @classmethod
    def fixed(cls, verifier: TokenVerifier, principals: frozenset[Principal]) -> InternalIdentity:
        """An identity read from no file (tests, fuzzing): ``principals``, always."""
        identity = cls(verifier, None)
        identity._principals = principals
        return identity

    def principals(self) -> frozenset[Principal]:
        """Who may make the cluster's internal calls now (the file looked at again when
        :data:`RECHECK_S` has passed)."""
        now = self._clock()
        if self.path is None or now - self._looked_at < RECHECK_S:
            return self._principals
        self._looked_at = now
        stamp: tuple[int, int, int] | None
        try:
            stamp = _stamp(self.path)
        except OSError as e:
            log.warning(
                "internal token file %s: %s; keeping the identity read before", self.path, e
            )
            stamp = self._stamp  # nothing to follow: the grace still runs out
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                principal = internal_principal(self.verifier, self.path)
            except ValueError as e:
                log.warning("%s; keeping the identity read before", e)
            else:
                if self._succession.follow(principal, now):
                    log.info(
                        "internal token file changed: the cluster's identity is %s "
                        "(the one before stays accepted for %g s)",
                        principal.member,
                        self._succession.grace_s,
                    )
        self._principals = self._succession.principals(now)
        return self._principals

    def allows(self, principal: Principal) -> bool:
        return principal in self.principals()


class InternalToken:
    """The process's internal token: none (plaintext cluster, authentication off) by default."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._token = ""
        self._mtime_ns = -1

    def configure(self, path: Path | None) -> str | None:
        """Use the token in ``path`` from now on (None: send none); returns it. A missing or
        empty file raises ValueError here, at start-up."""
        self.path = path
        self._token, self._mtime_ns = "", -1
        if path is None:
            return None
        self._token = read_token(path)
        self._mtime_ns = os.stat(path).st_mtime_ns
        return self._token

    def current(self) -> str | None:
        """The token now (read again if its file changed); None when none is configured."""
        if self.path is None:
            return None
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime != self._mtime_ns:
                self._token, self._mtime_ns = read_token(self.path), mtime
        except (OSError, ValueError):
            pass  # keep the last token read (rule 3)
        return self._token

    def metadata(self) -> Metadata:
        """The call metadata that carries the token: empty when none is configured."""
        token = self.current()
        if token is None:
            return ()
        return (("authorization", f"Bearer {token}"),)


INTERNAL_TOKEN = InternalToken()
