"""Apply what agents report to the database. Synchronous; the agent link's batcher
(console/intake/batcher.py) calls `apply_hosts` then `apply_readings` on a thread of their own with every
message its links received in one tick, so a thousand hosts cost a handful of bulk statements per tick, not a
transaction per message. Agent input only ever updates rows of the agent's own host.

Every message renews its host's lease (last_seen, written again once a quarter of the lease has passed; a batcher
looks at the leases due once a second: LeaseChecks): liveness never waits on what a report says."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from agent.engines import BUILTIN
from agent.protocol import Ack, GpuInfo, Hello, HostReport, ReplicaStatus
from agent.protocol.hostnames import host_name_refusal
from console.bulk import update_by_pk, update_fields_by_pk, update_in_key_order
from console.catalog.loads import Load, record_loads
from console.deployments.models import Replica
from console.events.record import Note, host_object, record
from console.fleet.events import replica_notes
from console.fleet.lifecycle import LEASE_SWEEP_SECONDS, renewal_seconds
from console.fleet.models import AgentCredential, Gpu, Host

log = logging.getLogger("modelgrid.fleet")


class RefusedHello(Exception):
    """The agent's hello cannot be accepted; the consumer closes the link."""


@dataclass(frozen=True)
class Closed:
    """The link of `epoch` closed: the host becomes unknown unless a newer link took over."""

    epoch: int


@dataclass(frozen=True)
class Item:
    """One message from one link, as the batcher hands it over."""

    host_id: int
    host_name: str
    message: HostReport | ReplicaStatus | Ack | Closed


@dataclass(frozen=True)
class Outcome:
    error: str | None = None  # why the message was refused (the link hears it); None: applied
    observed: bool = False  # a replica's observed state changed: deployments' states, gateways and dashboards follow
    ready: bool = False  # a replica's status that may free requests waiting at a gateway
    news: bool = False  # something the scheduler plans with changed (it is woken for a pass that plans)


def register_hello(credential: AgentCredential, hello: Hello) -> tuple[Host, int]:
    """The host of this hello, connected, and the epoch of the link that said it (it supersedes every
    earlier link of the host: only the newest link's close may mark the host unknown)."""
    refusal = host_name_refusal(hello.host)  # a token stored under such a name before the rule held
    if refusal is not None:
        raise RefusedHello(f"{refusal}; issue a token for a valid name (manage.py createagenttoken NAME) and start "
                           "the agent with --name NAME")
    if hello.host != credential.host_name:
        raise RefusedHello(
            f"this token is for host {credential.host_name!r}, but the agent says it is {hello.host!r}"
        )
    with transaction.atomic():
        host, _ = Host.objects.update_or_create(
            name=hello.host,
            defaults={"endpoint": hello.endpoint, "agent_version": hello.agent_version, "connected": True,
                      "engines": {e.name: e.version for e in hello.engines} or {BUILTIN.name: ""},
                      "last_seen": timezone.now(), "unknown_since": None, "evicted_at": None},
        )
        Host.objects.filter(pk=host.pk).update(link_epoch=F("link_epoch") + 1)
        host.refresh_from_db(fields=["link_epoch"])
        _sync_gpus({host.pk: hello.gpus}, prune=True)
        record([Note(host_object(host.name), "Connected", f"agent {hello.agent_version or '(no version)'} connected "
                     f"with {len(hello.gpus)} GPU(s), serving at {hello.endpoint or 'no endpoint'} (link epoch "
                     f"{host.link_epoch})", actor=f"agent {host.name}", host=host.name)])
    return host, host.link_epoch


def apply_batch(items: list[Item]) -> list[Outcome]:
    """Apply one tick's messages from every link, both stages; one outcome per item, in order."""
    return apply_readings(items, apply_hosts(items))


@dataclass
class Staged:
    """What apply_hosts leaves for apply_readings."""

    outcomes: list[Outcome | None]  # decided already: closes, acks, and items that failed
    reports: list[tuple[int, int, HostReport]] = field(default_factory=list)  # (item position, host, report)
    statuses: list[tuple[int, int, ReplicaStatus]] = field(default_factory=list)  # (position, host, status)
    news: set[int] = field(default_factory=set)  # hosts whose news the scheduler should see

    @staticmethod
    def joined(parts: list[tuple[int, Staged]]) -> Staged:
        """Several batches' stages as one, each (its first item's position in the joined items, its stage)."""
        joined = Staged([])
        for offset, part in parts:
            joined.outcomes += part.outcomes
            joined.reports += [(i + offset, host, report) for i, host, report in part.reports]
            joined.statuses += [(i + offset, host, status) for i, host, status in part.statuses]
            joined.news |= part.news
        return joined


# Two stages, each its own transaction, so that neither can take part in a deadlock with a scheduler pass (which
# takes replica rows, then host rows): first the links (leases, closed links, acks), host rows only, short and
# waiting for nothing else, so an ack is held up neither by a pass nor by the readings that came with it; then
# the readings: replicas' states by primary key as a pass writes them, then GPU rows and reports' host fields, so
# a GPU reading lands together with the states it explains. The batcher runs the next tick's first stage while
# this tick's second is still being applied. Should a stage fail (a database error), its items are retried one
# by one, so one bad message costs only itself (what the batch committed before it failed is applied again, to
# no effect).


class LeaseChecks:
    """Which hosts' leases a batcher looks at, and when: a host's once a renewal interval at most (its row was
    connected then, and written no longer than an interval before), and those due together, once a
    LEASE_SWEEP_SECONDS at most. A host's row is then at most two intervals and a sweep old (11 s of a 20 s lease),
    and cannot have lapsed, which takes a lease, an interval and a sweep. In a 1,000-host wave, the two statements
    that look (one for hosts coming back, one for leases due) locked host rows and cost every batch, an ack's among
    them, most of its time: 10 of the 14 s the hosts stage was busy while the fleet converged (sampled), waiting up to
    0.76 s for rows a pass held; looking at each host once an interval still had nearly every batch look at a few
    (docs/benchmarks.md)."""

    def __init__(self) -> None:
        self._at: dict[int, float] = {}  # host -> when (time.monotonic) a committed batch last looked at it
        self._waiting: set[int] = set()  # seen since, and due: looked at by the next sweep
        self._swept = -math.inf

    def due(self, hosts: Iterable[int], now: float) -> set[int]:
        """Of `hosts` (those a batch heard from) and those waiting, the ones to look at now: none between sweeps."""
        since = now - renewal_seconds(settings.MODELGRID_HOST_LEASE_SECONDS)
        self._waiting.update(h for h in hosts if self._at.get(h, -math.inf) < since)
        if not self._waiting or now - self._swept < LEASE_SWEEP_SECONDS:
            return set()
        self._swept = now
        # A host looked at before `since` is due as one never looked at: only later ones are kept (so hosts gone
        # from the fleet are not remembered for the life of the process).
        self._at = {h: at for h, at in self._at.items() if at >= since}
        return set(self._waiting)

    def looked(self, hosts: set[int], at: float) -> None:
        """A batch that looked at `hosts` committed (one that failed leaves them waiting)."""
        self._at.update(dict.fromkeys(hosts, at))
        self._waiting -= hosts

    def forget(self, hosts: Iterable[int]) -> None:
        """Their links closed: a sweep must not bring them back, and their next link's messages are looked at."""
        for h in hosts:
            self._at.pop(h, None)
            self._waiting.discard(h)


def apply_hosts(items: list[Item], leases: LeaseChecks | None = None) -> Staged:
    """The first stage: leases, closed links and acks. With `leases`, only the leases it says are due are looked
    at (and it learns of those once committed); without, every host's."""
    try:
        return _hosts(items, leases)
    except Exception as e:
        if len(items) == 1:
            log.exception("agent %s: applying its %s failed", items[0].host_name, _kind(items[0].message))
            return Staged([_failed(items[0], e)])
        log.exception("applying a batch of %d agent messages failed; applying them one by one", len(items))
    staged = Staged([])
    for i, item in enumerate(items):
        one = apply_hosts([item], leases)
        staged.outcomes += one.outcomes
        staged.reports += [(i, host, report) for _, host, report in one.reports]
        staged.statuses += [(i, host, status) for _, host, status in one.statuses]
        staged.news |= one.news
    return staged


def apply_readings(items: list[Item], staged: Staged) -> list[Outcome]:
    """The second stage: replicas' observed states (their events and loads), GPU readings and reports' host
    fields; every item's outcome."""
    outcomes = list(staged.outcomes)
    news = set(staged.news)
    try:
        observed = _readings(items, staged.reports, staged.statuses, news)
    except Exception:
        log.exception("applying agent messages' readings failed; applying them message by message")
        observed = set()
        for i in sorted({i for i, _, _ in staged.statuses} | {i for i, _, _ in staged.reports}):
            try:
                observed |= _readings(items, [r for r in staged.reports if r[0] == i],
                                      [s for s in staged.statuses if s[0] == i], news)
            except Exception as e:
                log.exception("agent %s: applying its %s failed", items[i].host_name, _kind(items[i].message))
                outcomes[i] = _failed(items[i], e)
    credited = _credited_hosts({items[i].host_id for i in observed})
    for i, item in enumerate(items):
        if outcomes[i] is None:
            m = item.message
            ready = i in observed and (isinstance(m, HostReport) or not (m.loaded_bytes and m.state == "loading"))
            outcomes[i] = Outcome(observed=i in observed, ready=ready,
                                  news=item.host_id in news or (i in observed and item.host_id in credited))
        elif item.host_id in news:
            outcomes[i] = Outcome(error=outcomes[i].error, news=True)
    return outcomes  # type: ignore[return-value]


def _credited_hosts(hosts: set[int]) -> set[int]:
    """Of these hosts, those whose agent does not say what its own workers hold on a GPU: the plan credits them with
    what their ready replicas measured (snapshot.gpu_specs), so a replica's state there is something it plans
    with. Elsewhere the plan reads no replica's observed state: a change is news for the deployments' states alone
    (and a first measurement's calibration waits for the next pass that plans, at the latest the resync)."""
    if not hosts:
        return set()
    return set(Gpu.objects.filter(host_id__in=hosts, own_bytes__isnull=True).values_list("host_id", flat=True))


def _kind(message) -> str:
    return getattr(message, "type", "close")


def _failed(item: Item, e: Exception) -> Outcome:
    return Outcome(error=f"the console could not apply this {_kind(item.message)} ({type(e).__name__}); "
                         "its log has the details")


def _hosts(items: list[Item], leases: LeaseChecks | None) -> Staged:
    now, looked_at = timezone.now(), time.monotonic()
    outcomes: list[Outcome | None] = [None] * len(items)
    closed: dict[int, int] = {}  # host -> the epoch whose link closed (the last close of the tick)
    renewed: set[int] = set()
    reports: list[tuple[int, int, HostReport]] = []
    statuses: list[tuple[int, int, ReplicaStatus]] = []
    acks: list[tuple[int, int, Ack]] = []
    for i, item in enumerate(items):
        m = item.message
        if isinstance(m, Closed):
            closed[item.host_id] = m.epoch
            renewed.discard(item.host_id)
            outcomes[i] = Outcome()
            continue
        renewed.add(item.host_id)
        closed.pop(item.host_id, None)
        if isinstance(m, HostReport):
            if m.gpus or m.serving is not None or m.ram_free_bytes is not None:
                reports.append((i, item.host_id, m))
            statuses.extend((i, item.host_id, s) for s in m.replicas)
        elif isinstance(m, ReplicaStatus):
            statuses.append((i, item.host_id, m))
        elif isinstance(m, Ack):
            acks.append((i, item.host_id, m))
    if leases is not None:
        leases.forget(closed)  # the host's next link is looked at afresh
        renewed = leases.due(renewed, looked_at)
    with transaction.atomic():
        if leases is not None and renewed:
            # Learnt only once committed: a lease written by a batch that failed was not written.
            transaction.on_commit(lambda: leases.looked(renewed, looked_at))
        notes: list[Note] = []
        news = _apply_to_hosts(now, renewed, closed, notes)
        record(notes, now)
        if acks:
            for i, error in _apply_acks(items, acks).items():
                outcomes[i] = Outcome(error=error)
    return Staged(outcomes, reports, statuses, news)


def _merged(earlier: HostReport | None, later: HostReport) -> HostReport:
    """Two reports of one host as one (for their host fields and GPUs). Each lists only what changed since the one
    before, so the later one's word wins where both speak, and the earlier one's stands where the later is silent:
    keeping only the newest lost a reading the first listed until the next whole report."""
    if earlier is None:
        return later
    gpus = {g.index: g for g in earlier.gpus} | {g.index: g for g in later.gpus}
    return later.model_copy(update={
        "gpus": list(gpus.values()),
        "serving": earlier.serving if later.serving is None else later.serving,
        "ram_free_bytes": earlier.ram_free_bytes if later.ram_free_bytes is None else later.ram_free_bytes})


def _readings(items: list[Item], reports: list[tuple[int, int, HostReport]],
              statuses: list[tuple[int, int, ReplicaStatus]], news: set[int]) -> set[int]:
    """Apply them; returns the positions of the items that changed a replica's observed state, and adds the hosts
    whose GPU readings or host fields changed to `news`."""
    if not reports and not statuses:
        return set()
    merged: dict[int, HostReport] = {}
    for _, host_id, report in reports:
        merged[host_id] = _merged(merged.get(host_id), report)
    with transaction.atomic():
        observed = _apply_statuses(items, statuses) if statuses else set()
        if merged:
            news |= _apply_reports(merged)
    return observed


def _apply_to_hosts(now: datetime, renewed: set[int], closed: dict[int, int], notes: list[Note]) -> set[int]:
    """Leases and closed links; returns the hosts whose news the scheduler should see. Hosts that came back or
    went unknown are told in `notes`."""
    news: set[int] = set()
    if renewed:
        # The lease. A host that was unknown is back: news (which of this batch's hosts it was does not matter,
        # the scheduler looks at them all); a host that was connected only lives on.
        # (unknown_since is cleared apart, so the hosts that came back can be named: the rare case pays for it.)
        if update_in_key_order(Host.objects.filter(pk__in=renewed, connected=False), connected=True, evicted_at=None):
            news |= renewed
            back = Host.objects.filter(pk__in=renewed, unknown_since__isnull=False)
            notes.extend(Note(host_object(name), "Reconnected", "its agent spoke again: the lease is renewed",
                              actor=f"agent {name}", host=name) for name in back.values_list("name", flat=True))
            back.update(unknown_since=None)
        # Written again only once a quarter of the lease has passed: a wave brings each host's acks and statuses
        # many times a second, and writing every batch's leases was half of an ack's batch (and locked the host
        # rows a pass writes). A row renewed lately is not even locked: it fails the filter.
        stale = now - timedelta(seconds=renewal_seconds(settings.MODELGRID_HOST_LEASE_SECONDS))
        update_in_key_order(Host.objects.filter(Q(last_seen__lt=stale) | Q(last_seen__isnull=True), pk__in=renewed),
                            last_seen=now)
    for host_id, epoch in sorted(closed.items()):
        # A superseded link's close is not news: the host lives on through its newest link.
        if Host.objects.filter(pk=host_id, link_epoch=epoch, connected=True).update(connected=False,
                                                                                   unknown_since=now):
            news.add(host_id)
            name = Host.objects.filter(pk=host_id).values_list("name", flat=True).first() or "?"
            notes.append(Note(host_object(name), "Disconnected", "its agent's link closed: the host is unknown and "
                              "keeps its replicas until the eviction timeout", warning=True, actor="console",
                              host=name))
    return news


def _apply_reports(reports: dict[int, HostReport]) -> set[int]:
    """Hosts' serving figures and sleep room (where a report gives them: None is "as before") and GPU readings
    (those a report lists); returns the hosts where any of them changed. A quiet host's report lists nothing
    and costs no query here."""
    given = {h: r for h, r in reports.items() if r.serving is not None or r.ram_free_bytes is not None}
    # An agent speaks only for the deployments it runs: figures for one with no replica on its host are
    # dropped, so no agent token can steer another host's scaling.
    here: dict[int, set[str]] = {}
    if any(r.serving for r in given.values()):
        for host_id, name in Replica.objects.filter(host_id__in=given).values_list(
                "host_id", "deployment__name").distinct():
            here.setdefault(host_id, set()).add(name)
    changed, news = [], set()
    for host in Host.objects.filter(pk__in=given).only("pk", "serving", "ram_free_bytes") if given else ():
        report = given[host.pk]
        serving = host.serving if report.serving is None else {
            s.deployment: s.model_dump(exclude={"deployment"}) for s in report.serving
            if s.deployment in here.get(host.pk, ())}
        ram = host.ram_free_bytes if report.ram_free_bytes is None else report.ram_free_bytes
        if (host.serving, host.ram_free_bytes) != (serving, ram):
            if host.ram_free_bytes != ram:
                news.add(host.pk)  # room for sleeping replicas: the plan reads it; traffic it reads at its interval
            host.serving, host.ram_free_bytes = serving, ram
            changed.append(host)
    if changed:
        update_by_pk(sorted(changed, key=lambda h: h.pk), ["serving", "ram_free_bytes"])
    listed = {host_id: r.gpus for host_id, r in reports.items() if r.gpus}
    return news | (_sync_gpus(listed) if listed else set())


_GPU_FIELDS = ("uuid", "name", "total_bytes", "used_bytes", "own_bytes", "utilization", "simulated")
FOREIGN_NEWS_BYTES = 256 << 20  # other processes' memory on a GPU moving less than this waits for the next pass


def _sync_gpus(gpus_by_host: dict[int, list[GpuInfo]], prune: bool = False) -> set[int]:
    """Write the GPUs' readings; only rows whose reading moved are written. Returns the hosts where what the plan
    reads of a GPU changed: one appeared, its size changed, or the memory other processes use on it moved by more
    than FOREIGN_NEWS_BYTES. A busy GPU's utilisation and its own workers' memory move with every reading; waking
    the scheduler for each was a pass per report."""
    rows = {(g.host_id, g.index): g for g in Gpu.objects.filter(host_id__in=gpus_by_host)}
    create, update, news = [], [], set()
    for host_id, gpus in gpus_by_host.items():
        for info in gpus:
            values = {f: getattr(info, f) for f in _GPU_FIELDS}
            row = rows.get((host_id, info.index))
            if row is None:
                create.append(Gpu(host_id=host_id, index=info.index, **values))
                news.add(host_id)
            elif any(getattr(row, f) != v for f, v in values.items()):
                if _plan_moves(row, info):
                    news.add(host_id)
                for f, v in values.items():
                    setattr(row, f, v)
                update.append(row)
    if create:
        Gpu.objects.bulk_create(create)
    if update:
        update_by_pk(sorted(update, key=lambda g: g.pk), _GPU_FIELDS)
    if prune:
        for host_id, gpus in gpus_by_host.items():
            Gpu.objects.filter(host_id=host_id).exclude(index__in=[g.index for g in gpus]).delete()
    return news


def _plan_moves(row: Gpu, info: GpuInfo) -> bool:
    """Whether a new reading changes what the plan reads of this GPU (its size, what other processes use)."""
    if row.total_bytes != info.total_bytes or (row.own_bytes is None) != (info.own_bytes is None):
        return True
    if info.own_bytes is None:  # an older agent: the plan credits its replicas' measurements, not its reading
        return row.used_bytes != info.used_bytes
    before, after = row.used_bytes - (row.own_bytes or 0), info.used_bytes - info.own_bytes
    return abs(after - before) > FOREIGN_NEWS_BYTES


_STATUS_FIELDS = ("observed_state", "pid", "measured_bytes", "loaded_bytes", "loading_total_bytes", "host_bytes",
                  "sleep_wake", "adapter_stats", "adapter_error", "observed_reason", "start_seconds")


def _status_fields(status: ReplicaStatus) -> dict:
    """The observed fields a status sets (those it leaves out keep their value)."""
    fields: dict = {"observed_state": status.state, "pid": status.pid, "host_bytes": status.host_bytes,
                    "adapter_stats": [a.model_dump() for a in status.adapters],
                    "adapter_error": status.adapter_error, "observed_reason": status.reason}
    if status.measured_bytes is not None:
        fields["measured_bytes"] = status.measured_bytes
    if status.loaded_bytes is not None:
        fields["loaded_bytes"] = status.loaded_bytes
    if status.total_bytes is not None:
        fields["loading_total_bytes"] = status.total_bytes
    if status.sleep_wake is not None:
        fields["sleep_wake"] = status.sleep_wake.model_dump()
    if status.measurement is not None and status.measurement.load_seconds is not None:
        fields["start_seconds"] = round(status.measurement.load_seconds, 3)
    return fields


def _apply_statuses(items: list[Item], statuses: list[tuple[int, int, ReplicaStatus]]) -> set[int]:
    """Record replicas' observed states (statuses for another host's replicas are ignored); returns the
    positions of the items that changed one."""
    # By key alone (a Q per host cost more to build than the read): a row on another host is skipped below.
    ids = {s.replica_id for _, _, s in statuses}
    rows = {r.pk: r for r in Replica.objects.filter(pk__in=ids).only("pk", "host_id", *_STATUS_FIELDS)}
    changed: dict[int, tuple[Replica, set[str]]] = {}  # pk -> the row, the fields that changed
    observed: set[int] = set()
    loads: list[Load] = []
    transitions: list[tuple[int, str, str, ReplicaStatus]] = []  # (replica, host, state before, status)
    for i, host_id, status in statuses:
        row = rows.get(status.replica_id)
        if row is None or row.host_id != host_id:
            log.debug("host %s reported unknown replica %s", items[i].host_name, status.replica_id)
            continue
        if status.state != row.observed_state:
            transitions.append((row.pk, items[i].host_name, row.observed_state, status))
        for f, v in _status_fields(status).items():
            if getattr(row, f) != v:
                setattr(row, f, v)
                changed.setdefault(row.pk, (row, set()))[1].add(f)
                observed.add(i)
        if status.state == "ready" and status.measurement is not None:
            loads.append(Load(items[i].host_name, status.replica_id, status.measurement, status.pid))
    if changed:
        # Only the fields that changed (a wave's statuses change two or three of the ten, seldom the JSON ones).
        update_fields_by_pk(Replica, changed.values())
    if loads:
        record_loads(loads)
    if transitions:
        record(replica_notes(transitions))
    return observed


def _apply_acks(items: list[Item], acks: list[tuple[int, int, Ack]]) -> dict[int, str | None]:
    """Record the generation each agent applied, for the whole tick at once (a read and a write per ack cost a
    100-host tick 200 round trips, each waiting for the GIL behind a busy pass). A generation the console never
    sent the host is refused: an acknowledged generation it has not reached would make the scheduler treat a
    desired state as applied before the agent ever saw it. Returns each ack's refusal, or None. (Generations only
    grow, so a read after the ack came cannot refuse a valid one.)"""
    record = _acked_in_one_statement if connection.vendor == "postgresql" else _acked_by_read_then_update
    sent = record(acks)
    return {i: (f"ack.generation {ack.generation} refused: the console has sent host {items[i].host_name!r} "
                f"generations up to {sent.get(host_id, 0)}, so an ack may name at most that one")
            if ack.generation > sent.get(host_id, 0) else None for i, host_id, ack in acks}


def _newest_allowed(acks: list[tuple[int, int, Ack]], sent: dict[int, int]) -> dict[int, int]:
    """Each host's newest ack that names a generation sent to it."""
    newest: dict[int, int] = {}
    for _, host_id, ack in acks:
        if ack.generation <= sent.get(host_id, 0):
            newest[host_id] = max(newest.get(host_id, 0), ack.generation)
    return newest


def _acked_by_read_then_update(acks: list[tuple[int, int, Ack]]) -> dict[int, int]:
    """Record the acks with one read of the hosts' generations and one pipelined UPDATE, in key order; returns
    each host's generation."""
    sent = dict(Host.objects.filter(pk__in={h for _, h, _ in acks}).values_list("pk", "generation"))
    newest = _newest_allowed(acks, sent)
    if newest:
        q = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.executemany(f"UPDATE {q(Host._meta.db_table)} SET {q('acked_generation')} = %s "
                               f"WHERE {q('id')} = %s AND {q('acked_generation')} < %s",
                               [(g, h, g) for h, g in sorted(newest.items())])
    return sent


def _acked_in_one_statement(acks: list[tuple[int, int, Ack]]) -> dict[int, int]:
    """PostgreSQL: _acked_by_read_then_update in one statement, which locks the hosts' rows in key order (as every
    writer of host rows does) and keeps the same newest allowed ack per host. The read, then the pipelined UPDATE,
    cost a wave's batch of 600 acks 45-121 ms of wall time on 4.5-12 ms of CPU: each return from the database waited
    for the interpreter lock (docs/benchmarks.md)."""
    table = connection.ops.quote_name(Host._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"""
            WITH v (id, g) AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[])),
            cur AS (SELECT h.id, h.generation FROM {table} h WHERE h.id IN (SELECT id FROM v)
                    ORDER BY h.id FOR NO KEY UPDATE OF h),
            best AS (SELECT v.id, max(v.g) AS g FROM v JOIN cur ON cur.id = v.id WHERE v.g <= cur.generation
                     GROUP BY v.id),
            done AS (UPDATE {table} h SET acked_generation = best.g FROM best
                     WHERE h.id = best.id AND h.acked_generation < best.g)
            SELECT id, generation FROM cur""", [[h for _, h, _ in acks], [a.generation for _, _, a in acks]])
        return dict(cursor.fetchall())


def apply_one(host: Host, message: HostReport | ReplicaStatus | Ack) -> Outcome:
    """One message alone (management commands and tests; the links batch theirs)."""
    return apply_batch([Item(host.pk, host.name, message)])[0]
