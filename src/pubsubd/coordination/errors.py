"""Errors of the coordination service, as pubsubd names them (callers never import kazoo).

``zk.Coordinator`` translates kazoo's exceptions into these: a missing znode (``NoNode``), a
create that found one (``NodeExists``), a compare-and-set that lost (``BadVersion``), a delete
of a znode that still has children (``NotEmpty``), a znode whose ACL refuses this session
(``AccessDenied``: ZooKeeper's NoAuth, a process without the cluster's credential or with a
wrong one), and ZooKeeper being out of reach (``CoordinationUnavailable``: connection lost,
session expired, client stopped, no answer in time). The last is also a domain
``Unavailable``, so a control-plane call that cannot reach ZooKeeper answers UNAVAILABLE and
the client retries.

:func:`startup_failure` is how every role says ZooKeeper failed it at start-up: a refusal as
the refusal it is (naming the credential and ``--zk-auth-file``), not as unreachability.
"""

from __future__ import annotations

from pubsubd.core.errors import Unavailable


class CoordinationError(Exception):
    """Base of what a coordination call can raise; ``path`` is the znode it was about."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        # In a failed transaction: the index of the operation that failed.
        self.op_index: int | None = None


class NoNode(CoordinationError):
    """The znode (or, for a create, its parent) does not exist."""


class NodeExists(CoordinationError):
    """A create found the znode already there (an ephemeral owner, a name taken)."""


class BadVersion(CoordinationError):
    """A compare-and-set or versioned delete lost: the znode changed since it was read."""


class NotEmpty(CoordinationError):
    """A non-recursive delete of a znode that has children."""


class CoordinationUnavailable(Unavailable, CoordinationError):
    """ZooKeeper cannot be reached now (connection lost, session expired, client stopped, or no
    answer within the request timeout). The outcome of a write that raised this is unknown:
    read before retrying it."""

    def __init__(self, message: str, path: str | None = None) -> None:
        CoordinationError.__init__(self, message, path)


class SessionExpired(CoordinationUnavailable):
    """The ZooKeeper session ended: its ephemeral znodes are gone, and with them any ownership
    this process held. The client reconnects with a new session."""


class AccessDenied(CoordinationError):
    """ZooKeeper refused the request (NoAuth): the znode's ACL does not let this session's
    identity do it. The cluster's znodes are protected by its credential
    (``coordination/credentials.py``) and this process has none, or another one."""


def access_denied(error: BaseException) -> AccessDenied | None:
    """ZooKeeper's refusal in ``error``'s chain (itself, its cause or context), if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, AccessDenied):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def startup_failure(doing: str, error: BaseException) -> str:
    """The one line a process ends with when ZooKeeper failed it at start-up while ``doing``
    ("reach ZooKeeper at H"): ZooKeeper's refusal (:class:`AccessDenied`, which names the
    credential and ``--zk-auth-file``) as it is, anything else as ``cannot {doing}: ...``."""
    denied = access_denied(error)
    if denied is not None:
        return str(denied)
    return f"cannot {doing}: {error}"
