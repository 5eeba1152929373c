"""Domain errors of pubsubd: one hierarchy, translated to gRPC/HTTP status in api/grpc/status.py.

Servicers and forwarders raise these; nothing below the API layer imports grpc. Each error builds
its message from its data, so the text a client sees names what was wrong.
"""

from __future__ import annotations


class PubsubError(Exception):
    """Base of every error a client can be told about."""

    retriable = False


# --- the client did something wrong ----------------------------------------------------------


class InvalidArgument(PubsubError):
    """A request field is malformed or out of range; the message names the field."""


class OutOfRange(InvalidArgument):
    """A numeric field is outside its allowed range (Google answers OUT_OF_RANGE for some)."""


class InvalidResourceName(InvalidArgument):
    def __init__(self, kind: str, name: str, why: str = "") -> None:
        self.kind = kind
        self.name = name
        detail = f": {why}" if why else ""
        super().__init__(f"Invalid [{kind}] name: (name={name}){detail}")


class InvalidAckId(InvalidArgument):
    def __init__(self, ack_id: str) -> None:
        self.ack_id = ack_id
        super().__init__(f"You have passed an invalid ack ID to the service (ack_id={ack_id!r}).")


class AckIdsInvalid(InvalidArgument):
    """Exactly-once: some ack IDs were expired, superseded or malformed (the rest were applied).

    ``failures`` maps each failed ack ID to Google's reason; the API layer sends it as a
    google.rpc.ErrorInfo (reason EXACTLY_ONCE_ACKID_FAILURE) the official client reads per ID.
    """

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = failures
        super().__init__(
            "Some acknowledgement ids in the request were invalid. This could be because the "
            "acknowledgement ids have expired or the acknowledgement ids were malformed."
        )


class Unauthenticated(PubsubError):
    """The call carried no valid credentials (authentication is on): a missing, malformed,
    badly signed, expired or not-yet-valid bearer token; the message says which."""


class NotFound(PubsubError):
    """A named resource does not exist."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind.capitalize()} not found (resource={name})")


class TopicNotFound(NotFound):
    def __init__(self, name: str) -> None:
        super().__init__("topic", name)


class SubscriptionNotFound(NotFound):
    def __init__(self, name: str) -> None:
        super().__init__("subscription", name)


class CursorNotFound(NotFound):
    """A named cursor of the replay API that the topic does not have (never committed or
    deleted)."""

    def __init__(self, topic: str, name: str) -> None:
        super().__init__("cursor", name)
        self.topic = topic
        self.args = (f"Cursor not found (topic={topic}, name={name})",)


class AlreadyExists(PubsubError):
    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind.capitalize()} already exists (resource={name})")


class FailedPrecondition(PubsubError):
    """The resource is in a state that does not allow the call (e.g. a detached subscription)."""


class PermissionDenied(PubsubError):
    """The caller lacks a permission the call needs (IAM, core/iam.py): PERMISSION_DENIED, 403."""

    def __init__(self, permission: str, resource: str, member: str) -> None:
        self.permission = permission
        self.resource = resource
        self.member = member
        super().__init__(
            f"User not authorized to perform this action: {member} lacks permission "
            f"'{permission}' on resource '{resource}' (or it may not exist)"
        )


class NotInternalCaller(PermissionDenied):
    """A valid token whose principal is not the cluster's own identity (the internal token's,
    ``core/internal_token.py``) called a service only the cluster's processes may call (a
    storage node): PERMISSION_DENIED, 403."""

    def __init__(self, member: str, service: str) -> None:
        self.permission = "(the cluster's internal identity)"
        self.resource = service
        self.member = member
        PubsubError.__init__(
            self,
            f"{member} is not the cluster's internal identity: only the cluster's own "
            f"processes (their --internal-token-file token) may call {service}",
        )


class Aborted(PubsubError):
    """A compare-and-set lost to a concurrent change (an IAM policy's etag): ABORTED, 409.
    Retriable as a whole: read again, then write."""

    retriable = True


class ConcurrentUpdate(Aborted):
    """An update's write found the resource changed since it was read (another request, here
    or in another process of a cluster, updated it in between): nothing was stored. The API
    layer reads again and applies the update over the newer resource before answering this."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(
            f"{kind} {name} was changed by another request at the same time; "
            "read it again and retry"
        )


class ResourceExhausted(PubsubError):
    """A quota or flow-control limit was hit; the client may retry later."""

    retriable = True


class DiskFull(ResourceExhausted):
    """A write failed because the file system of the data directory is full (ENOSPC, EDQUOT,
    SQLITE_FULL). Nothing acknowledged is lost; the same call succeeds once space is freed."""

    def __init__(self, directory: str, free_bytes: int | None, what: str, reason: str) -> None:
        self.directory = directory
        self.free_bytes = free_bytes
        self.what = what
        self.reason = reason
        free = "free space unknown" if free_bytes is None else f"{free_bytes} bytes free"
        super().__init__(
            f"Disk full: cannot write the {what} in data directory {directory} ({free}): "
            f"{reason}. Retry once disk space is freed."
        )


# --- we failed -------------------------------------------------------------------------------


class Unavailable(PubsubError):
    """The server is shutting down or cannot serve now; the client should retry or reconnect."""

    retriable = True


# How a forwarder's refusal of a resource it does not own begins (a frontend that reads it
# tries the resource's other forwarders, then waits for the next assignment).
NOT_SERVED_HERE = "not served here"
# The header a forwarder sends once it accepts a StreamingPull (it owns the subscription): a
# frontend writes the client's later requests only after it (frontend/proxy.py).
STREAM_ACCEPTED = ("pubsubd-stream", "accepted")


class NotServedHere(Unavailable):
    """A forwarder of a cluster was asked for a topic or subscription another one owns (the
    caller's route is stale, or the resource is moving): UNAVAILABLE, retried elsewhere."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{NOT_SERVED_HERE}: {what} is owned by another forwarder")


class InternalError(PubsubError):
    """Something failed inside the server (storage I/O, a bug)."""


class DataLoss(PubsubError):
    """Stored messages are damaged (a flipped byte, a lost sector, a lost file) and cannot be
    read; the message names the topic, the source, the offsets and the file, and what the
    operator can do (restore the bytes, or skip them)."""
