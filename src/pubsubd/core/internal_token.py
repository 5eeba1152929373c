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
5. The token's principal (:func:`internal_principal`, read once at start-up from the same
   file with the process's own verifier) is the cluster's identity. A forwarder lets it past
   IAM; a storage node lets *only* it call (:func:`require_internal`: any other valid token,
   a client's or an admin's, is refused PERMISSION_DENIED on gRPC and on the append port).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from pubsubd.core.errors import NotInternalCaller, Unauthenticated
from pubsubd.core.principal import Principal
from pubsubd.core.tokens import TokenVerifier

__all__ = [
    "INTERNAL_TOKEN",
    "InternalToken",
    "internal_principal",
    "read_token",
    "require_internal",
]

Metadata = tuple[tuple[str, str], ...]


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
