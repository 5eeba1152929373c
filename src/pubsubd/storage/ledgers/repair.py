"""What the repair auditor does about each ledger (pure: no I/O, no clock; ``now`` is passed).

SCALE_OUT.md §2, step 7. The auditor (``ledgers/auditor.py``) lists every storage node's copies
(``ListLedgers``: first and end offset, digest, fence) and every source's ledger list, then asks
this module, per CLOSED ledger ``[first, end)``, what is wrong and what to copy. OPEN and
IN_RECOVERY ledgers belong to their writer and are never touched.

A listed node's copy is judged against the ledger's closed range:

* the node is not registered: ``UNREGISTERED`` while it has been gone less than the grace
  period, then ``LOST``: its copy is made again on a replacement node (registered, not already
  in the list, in an allowed zone, preferably a zone the other copies are not in) and the node
  list is changed by compare-and-set;
* the node did not answer ``ListLedgers``: ``UNKNOWN`` (nothing is decided about it this pass);
* no copy: ``MISSING``, copied again from the first offset;
* a copy that starts elsewhere: ``DIVERGENT``;
* a copy that ends before the ledger's end: ``SHORT``, the missing tail is appended from a
  healthy copy (the next pass compares its digest, and a prefix that differs is then
  ``DIVERGENT``);
* a copy that ends *after* the ledger's end: ``LONG``. It holds entries that were never
  acknowledged (an append that reached fewer than a quorum before the ledger was closed).
  The digest a node reports covers its whole copy, so such a copy cannot be compared; we
  choose to make it comparable: it is deleted and copied again from a verified copy (one
  ledger's bytes, once; the extra entries are never copied anywhere and never count as
  divergence). While it is the only copy that reaches the end it is used as the source
  instead (unverified) and kept;
* copies that end exactly at the ledger's end are scrubbed: the digest most of them share is
  the ledger's, a copy with another one is ``DIVERGENT`` (deleted and copied again). Equal
  counts of different digests are a ``CONFLICT``: nothing can tell which is right, so the
  ledger is left alone and reported.

A ledger with fewer nodes than the policy's copies (opened while nodes were missing) gets
``TOO_FEW`` and more nodes. A copy on a node whose zone the topic's storage policy no longer
allows (the policy changed; the writer's open ledger rolls at once, closed ones stay) is
``MISPLACED``: made again on a node of an allowed zone, which takes its place in the list (the
old copy is then an orphan, below). Copies go out with an epoch at least the ledger's fence on every
copy seen (the ledger is CLOSED, so raising its fence on the target is harmless).

Ledgers a node holds that no ledger list mentions, or that a CLOSED ledger's list does not give
to that node (a replaced node that came back, a copy whose node-list update failed, a trim whose
delete failed) are orphans, deleted once they have been seen as orphans for the grace period.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import google_crc32c

from pubsubd.storage.framing import scan_frames
from pubsubd.storage.ledgers.meta import LedgerMeta, LedgerState, StoragePolicy
from pubsubd.storage.ledgers.placement import NodeInfo

K = TypeVar("K")

__all__ = [
    "CopyInfo",
    "CopyTask",
    "Finding",
    "Issue",
    "LedgerPlan",
    "RateLimiter",
    "RepairSettings",
    "Sightings",
    "extend_digest",
    "find_orphans",
    "plan_ledger",
]


@dataclass(frozen=True, slots=True)
class RepairSettings:
    """How often the auditor looks, how long a node may be gone, how fast repair copies."""

    interval_s: float = 30.0  # between the end of one pass and the start of the next
    grace_s: float = 60.0  # a node gone (or an orphan seen) this long is acted on
    rate_bytes: int = 32 << 20  # bytes copied per second at most

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"the repair interval must be positive, not {self.interval_s!r}")
        if not self.grace_s >= 0:
            raise ValueError(f"the repair grace period must be >= 0, not {self.grace_s!r}")
        if self.rate_bytes <= 0:
            raise ValueError(f"the repair rate must be positive, not {self.rate_bytes!r}")


@dataclass(frozen=True, slots=True)
class CopyInfo:
    """One node's copy of a ledger, as its ``ListLedgers`` answer says."""

    first_offset: int
    end_offset: int
    digest: int
    fenced_epoch: int = 0
    bytes: int = 0


class Issue(enum.Enum):
    UNREGISTERED = "unregistered"  # not registered, within the grace period
    LOST = "lost"  # not registered for longer than the grace period
    UNKNOWN = "unknown"  # registered, did not answer ListLedgers
    MISSING = "missing"
    SHORT = "short"
    LONG = "long"
    DIVERGENT = "divergent"
    TOO_FEW = "too-few"  # fewer nodes than the policy's copies
    CONFLICT = "conflict"  # full copies disagree and no digest has a majority
    MISPLACED = "misplaced"  # on a node of a zone the topic's storage policy no longer allows


# Findings that do not (yet) make a ledger under-replicated.
_NOT_COUNTED = frozenset({Issue.UNKNOWN})


@dataclass(frozen=True, slots=True)
class Finding:
    node: str  # "" for the ledger as a whole
    issue: Issue


@dataclass(frozen=True, slots=True)
class CopyTask:
    """Copy entries ``[start, end)`` of ``ledger`` from ``source`` to ``target``."""

    ledger: LedgerMeta
    source: str  # "" when there is nothing to copy (an empty ledger)
    target: str
    start: int
    end: int
    epoch: int  # fence the target at this epoch, then append with it
    delete_first: bool  # delete whatever the target holds of the ledger first
    replaces: str | None  # the node it takes the place of in the list (None: already listed)
    adds: bool = False  # the target joins the list (TOO_FEW)
    expected_digest: int | None = None  # the ledger's verified digest (checked on a whole copy)
    reason: Issue = Issue.MISSING

    @property
    def changes_list(self) -> bool:
        return self.replaces is not None or self.adds


@dataclass(frozen=True, slots=True)
class LedgerPlan:
    ledger: LedgerMeta
    findings: tuple[Finding, ...] = ()
    tasks: tuple[CopyTask, ...] = ()
    blocked: str = ""  # why (part of) it cannot be repaired now
    digest: int | None = None  # the ledger's digest (the majority of its full copies)
    healthy: tuple[str, ...] = ()  # nodes whose copies are verified

    @property
    def under_replicated(self) -> bool:
        return any(f.issue not in _NOT_COUNTED for f in self.findings)

    @property
    def waiting(self) -> bool:
        """Only nodes within their grace period are wrong (nothing to do yet)."""
        issues = {f.issue for f in self.findings} - _NOT_COUNTED
        return bool(issues) and issues <= {Issue.UNREGISTERED}


def plan_ledger(
    ledger: LedgerMeta,
    *,
    registered: Mapping[str, NodeInfo],
    copies: Mapping[str, Mapping[int, CopyInfo]],
    lost: frozenset[str],
    policy: StoragePolicy,
) -> LedgerPlan:
    """What is wrong with ``ledger`` and what to copy. ``registered``: the storage nodes
    registered now; ``copies``: per node that answered ``ListLedgers``, its copies by ledger
    ID; ``lost``: nodes not registered for longer than the grace period."""
    if ledger.state is not LedgerState.CLOSED or ledger.end_offset is None:
        return LedgerPlan(ledger)
    first, end = ledger.first_offset, ledger.end_offset
    empty = end == first
    findings: list[Finding] = []
    full: dict[str, CopyInfo] = {}
    repair_same: dict[str, tuple[Issue, CopyInfo | None]] = {}
    long_copies: dict[str, CopyInfo] = {}
    gone: list[str] = []
    misplaced: list[str] = []
    fences = [ledger.epoch]
    for node in ledger.nodes:
        if node not in registered:
            if node in lost:
                findings.append(Finding(node, Issue.LOST))
                gone.append(node)
            else:
                findings.append(Finding(node, Issue.UNREGISTERED))
            continue
        held = copies.get(node)
        if held is None:
            findings.append(Finding(node, Issue.UNKNOWN))
            continue
        copy = held.get(ledger.ledger_id)
        if copy is not None:
            fences.append(copy.fenced_epoch)
        if empty:
            continue  # nothing was ever written: no node has (or needs) an entry
        if policy.allowed_zones and registered[node].zone not in policy.allowed_zones:
            findings.append(Finding(node, Issue.MISPLACED))
            misplaced.append(node)
        if copy is None:
            findings.append(Finding(node, Issue.MISSING))
            repair_same[node] = (Issue.MISSING, None)
        elif copy.first_offset != first:
            findings.append(Finding(node, Issue.DIVERGENT))
            repair_same[node] = (Issue.DIVERGENT, copy)
        elif copy.end_offset < end:
            findings.append(Finding(node, Issue.SHORT))
            repair_same[node] = (Issue.SHORT, copy)
        elif copy.end_offset > end:
            findings.append(Finding(node, Issue.LONG))
            long_copies[node] = copy
        else:
            full[node] = copy
    epoch = max(fences)

    # Scrub: the digest most full copies share is the ledger's.
    digest: int | None = None
    blocked = ""
    if full:
        counts = Counter(c.digest for c in full.values()).most_common()
        if len(counts) > 1 and counts[0][1] == counts[1][1]:
            findings.append(Finding("", Issue.CONFLICT))
            return LedgerPlan(
                ledger,
                tuple(findings),
                blocked=f"copies disagree with no majority: {_describe_digests(full)}",
            )
        digest = counts[0][0]
        for node, copy in full.items():
            if copy.digest != digest:
                findings.append(Finding(node, Issue.DIVERGENT))
                repair_same[node] = (Issue.DIVERGENT, copy)
    healthy = tuple(sorted(n for n, c in full.items() if c.digest == digest))

    # Where the entries come from: a verified copy, else (unverified) one that reaches past
    # the end, which is then kept this pass.
    sources = list(healthy)
    verified = bool(sources)
    if not sources and long_copies:
        sources = sorted(long_copies)
    if verified:
        for node in long_copies:
            repair_same[node] = (Issue.LONG, long_copies[node])

    # More nodes: replacements of lost ones, then extra ones up to the policy's copies.
    targets = _candidates(registered, copies, ledger, policy)
    kept_zones = [registered[n].zone for n in ledger.nodes if n in registered]
    tasks: list[CopyTask] = []
    replacements: list[tuple[str, str | None]] = []  # (new node, replaced node or None)
    for node in [*gone, *misplaced]:
        choice = _choose(targets, kept_zones, ledger.ledger_id)
        if choice is None:
            if node in misplaced:
                blocked = blocked or f"no storage node in an allowed zone can take {node}'s copy"
            else:
                blocked = blocked or f"no storage node can replace {node}"
            continue
        targets.remove(choice)
        kept_zones.append(choice.zone)
        replacements.append((choice.node_id, node))
        repair_same.pop(node, None)  # it leaves the list: not worth repairing in place
    listed = len(ledger.nodes)
    if listed < policy.replicas:
        findings.append(Finding("", Issue.TOO_FEW))
        for _ in range(policy.replicas - listed):
            choice = _choose(targets, kept_zones, ledger.ledger_id)
            if choice is None:
                blocked = blocked or "not enough storage nodes for the policy's copies"
                break
            targets.remove(choice)
            kept_zones.append(choice.zone)
            replacements.append((choice.node_id, None))

    if not sources and not empty and (repair_same or replacements):
        reason = "no copy holds the whole ledger"
        return LedgerPlan(ledger, tuple(findings), blocked=reason, digest=digest)

    def source_for(index: int) -> str:
        if empty:
            return ""
        return sources[(ledger.ledger_id + index) % len(sources)]

    expected = digest if verified else None
    for node, (issue, copy) in sorted(repair_same.items()):
        if node in sources:
            continue  # the only copy that reaches the end: kept this pass
        if issue is Issue.SHORT and copy is not None:
            start, delete = copy.end_offset, False
        else:
            start, delete = first, copy is not None
        tasks.append(
            CopyTask(
                ledger,
                source_for(len(tasks)),
                node,
                start,
                end,
                epoch,
                delete,
                None,
                expected_digest=expected,
                reason=issue,
            )
        )
    for new, old in replacements:
        holds = ledger.ledger_id in copies.get(new, {})
        tasks.append(
            CopyTask(
                ledger,
                source_for(len(tasks)),
                new,
                first,
                end,
                epoch,
                holds,
                old,
                adds=old is None,
                expected_digest=expected,
                reason=(
                    Issue.TOO_FEW
                    if old is None
                    else Issue.MISPLACED
                    if old in misplaced
                    else Issue.LOST
                ),
            )
        )
    return LedgerPlan(ledger, tuple(findings), tuple(tasks), blocked, digest, healthy)


def _describe_digests(full: Mapping[str, CopyInfo]) -> str:
    return ", ".join(f"{n}={c.digest:08x}" for n, c in sorted(full.items()))


def _candidates(
    registered: Mapping[str, NodeInfo],
    copies: Mapping[str, Mapping[int, CopyInfo]],
    ledger: LedgerMeta,
    policy: StoragePolicy,
) -> list[NodeInfo]:
    """Nodes that may take a new copy: registered, answering, not listed, allowed zone."""
    return sorted(
        (
            n
            for n in registered.values()
            if n.node_id not in ledger.nodes
            and n.node_id in copies
            and (not policy.allowed_zones or n.zone in policy.allowed_zones)
        ),
        key=lambda n: n.node_id,
    )


def _choose(candidates: list[NodeInfo], used_zones: list[str], spread: int) -> NodeInfo | None:
    """A node of the least used zone; ``spread`` (the ledger ID) picks among equals."""
    if not candidates:
        return None
    uses = Counter(used_zones)
    least = min(uses[n.zone] for n in candidates)
    best = [n for n in candidates if uses[n.zone] == least]
    return best[spread % len(best)]


def find_orphans(
    held: Mapping[str, Iterable[int]], ledgers: Iterable[LedgerMeta]
) -> set[tuple[str, int]]:
    """(node, ledger ID) of copies nobody needs: the ledger is in no list, or it is CLOSED and
    its list does not give it to that node. Copies of OPEN or IN_RECOVERY ledgers are their
    writer's business and never orphans."""
    by_id = {m.ledger_id: m for m in ledgers}
    out = set()
    for node, ids in held.items():
        for ledger_id in ids:
            meta = by_id.get(ledger_id)
            if meta is None or (meta.state is LedgerState.CLOSED and node not in meta.nodes):
                out.add((node, ledger_id))
    return out


class Sightings(Generic[K]):
    """Since when each key has been seen without a break (absent nodes, orphans)."""

    def __init__(self) -> None:
        self.since: dict[K, float] = {}

    def update(self, seen: Iterable[K], now: float) -> None:
        """The keys seen now; a key not among them starts again from zero."""
        self.since = {k: self.since.get(k, now) for k in set(seen)}

    def due(self, now: float, grace_s: float) -> set[K]:
        return {k for k, t in self.since.items() if now - t >= grace_s}


def extend_digest(digest: int, frames: bytes) -> tuple[int, int | None, int]:
    """``digest`` extended by the CRC fields of ``frames`` (the storage node's digest:
    CRC32C over the frames' CRC fields in order); returns it, the offset after the last
    frame (None if there is none) and the number of valid bytes."""
    scan = scan_frames(frames)
    for f in scan.frames:
        crc = frames[f.position + 4 : f.position + 8]
        digest = int(google_crc32c.extend(digest, crc))
    end = scan.frames[-1].next_offset if scan.frames else None
    return digest, end, scan.valid_end


@dataclass
class RateLimiter:
    """A token bucket of bytes: ``take(n, now)`` returns how long to wait before going on."""

    rate: float  # bytes per second
    burst: float = 0.0  # bytes that may go at once (default: one second's worth)
    _tokens: float = 0.0
    _last: float | None = None

    def __post_init__(self) -> None:
        if self.burst <= 0:
            self.burst = self.rate
        self._tokens = self.burst

    def take(self, nbytes: int, now: float) -> float:
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= nbytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
