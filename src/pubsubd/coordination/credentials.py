"""The cluster's ZooKeeper credential: a ``user:password`` pair for ZooKeeper's digest scheme.

With a credential (``--zk-auth-file FILE``, ``PUBSUBD_ZK_AUTH_FILE``), every ZooKeeper session
of the process authenticates as that identity (``zk.Coordinator``: kazoo's ``auth_data``), and
every znode it creates carries an ACL giving that identity every right and anyone else none.
Digest authentication needs no server configuration: ZooKeeper accepts any ``user:password``
and names the session by its digest, so a wrong password is not refused at connect time; it is
refused (NoAuth) at the first read of a protected znode, which ``Coordinator.start`` makes.

Rules:

1. The file holds one line ``user:password``: the user has no ``:``, neither part is empty,
   surrounding whitespace is dropped. Anyone who can read it may read and write every znode
   of the cluster: keep it 0600 (:func:`write_credential` does).
2. Like ``core.tls.ZOOKEEPER``, the credential is one process setting
   (:data:`ZOOKEEPER_CREDENTIAL`), configured once at start-up by the CLI before anything
   connects; a ``Coordinator`` may be given another (tests, ``cluster status``).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ZOOKEEPER_CREDENTIAL",
    "DigestCredential",
    "ProcessCredential",
    "load_credential",
    "write_credential",
]

CREDENTIAL_USER = "pubsubd"


@dataclass(frozen=True)
class DigestCredential:
    user: str
    password: str = field(repr=False)
    source: Path | None = None  # the file it was read from, for error messages

    def __post_init__(self) -> None:
        if not self.user or ":" in self.user or not self.password:
            raise ValueError("a ZooKeeper credential is user:password (no ':' in the user)")

    @property
    def auth(self) -> str:
        """What the digest scheme's ``addauth`` takes: ``user:password``."""
        return f"{self.user}:{self.password}"

    def describe(self) -> str:
        where = f" in {self.source}" if self.source is not None else ""
        return f"the credential of user {self.user!r}{where}"


def load_credential(path: Path) -> DigestCredential:
    """The credential in ``path``; ValueError names what is wrong (rule 1)."""
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise ValueError(f"ZooKeeper credential file {path}: {e.strerror or e}") from None
    user, colon, password = text.partition(":")
    if not colon or not user or not password or "\n" in text:
        raise ValueError(
            f"ZooKeeper credential file {path}: expected one line user:password "
            "(pubsubd cluster up --zk-auth makes one)"
        )
    return DigestCredential(user, password, path)


def write_credential(path: Path) -> DigestCredential:
    """A new random credential written to ``path`` (mode 0600); one already there is kept
    (a cluster started again must keep the identity its znodes' ACLs name)."""
    if path.exists():
        return load_credential(path)
    credential = DigestCredential(CREDENTIAL_USER, secrets.token_urlsafe(24), path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(credential.auth + "\n")
    return credential


class ProcessCredential:
    """The process's credential for its ZooKeeper sessions: None (no authentication) by
    default; set once at start-up (``configure``) before any session opens."""

    def __init__(self) -> None:
        self.credential: DigestCredential | None = None

    def configure(self, path: Path | None) -> DigestCredential | None:
        """Use the credential in ``path`` (None: none); a bad file raises ValueError here."""
        self.credential = load_credential(path) if path is not None else None
        return self.credential


ZOOKEEPER_CREDENTIAL = ProcessCredential()
