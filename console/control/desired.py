"""Each host's desired state: what the agent there should run, built from the replica rows."""

from __future__ import annotations

import hashlib
import json

from django.db import connection
from django.db.models import Q, TextField
from django.db.models.functions import Cast

from agent.engines import AUTO, BUILTIN, auto_engine
from agent.protocol import DesiredReplica, DesiredState
from console.bulk import JsonText, update_in_key_order, upsert_values
from console.catalog.models import Adapter
from console.deployments.models import Deployment, Replica
from console.fleet.models import AgentCredential, Gpu, Host, HostDesired


def desired_rows_by_host(host_ids) -> dict[int, list[dict]]:
    """The desired replicas of these hosts as stored and pushed (each a DesiredReplica in JSON form, every field
    named), built in a few queries whatever their number from plain rows: a pass that placed 10,000 replicas
    spent 9 of its 28 s building model instances, pydantic models and their dumps for this. Each deployment is
    read once, not once per replica, and only deployments with adapters read their replicas' adapter use."""
    host_ids = list(host_ids)
    out: dict[int, list[dict]] = {host_id: [] for host_id in host_ids}
    replicas = list(Replica.objects.filter(host_id__in=host_ids).order_by("pk").values_list(
        "pk", "host_id", "deployment_id", "index", "reserved_bytes", "desired_state", "mps_percentage", "held"))
    if not replicas:
        return out
    gpus: dict[int, list[int]] = {}
    for replica_id, index in Replica.gpus.through.objects.filter(replica__host_id__in=host_ids).values_list(
            "replica_id", "gpu__index"):
        gpus.setdefault(replica_id, []).append(index)
    on_hosts = Q(replica_set__host_id__in=host_ids)
    deployments = {pk: rest for pk, *rest in Deployment.objects.filter(on_hosts).distinct().order_by().values_list(
        "pk", "name", "model__path", "model__architecture", "dtype", "model__stored_dtype", "batch", "seq",
        "max_batch_size", "max_batch_delay_ms", "engine", "engine_args", "revision", "model__engine_refusals",
        "model__shape", "model__task")}
    engines = dict(Host.objects.filter(pk__in=host_ids).values_list("pk", "engines"))
    with_gpus = set(Gpu.objects.filter(host_id__in=host_ids, simulated=False).values_list("host_id", flat=True))
    adapters: dict[int, list[tuple[str, str, bool, int]]] = {}
    for dep, name, path, pinned, nbytes in Adapter.objects.filter(
            deployment__in=Deployment.objects.filter(on_hosts)).order_by("name").values_list(
            "deployment_id", "name", "path", "pinned", "nbytes"):
        adapters.setdefault(dep, []).append((name, path, pinned, nbytes))
    requests: dict[int, dict[str, int]] = {pk: {} for pk in adapters}  # adapter requests per deployment
    for dep, stats in Replica.objects.filter(deployment_id__in=list(adapters)).values_list("deployment_id",
                                                                                          "adapter_stats"):
        for stat in stats or ():
            requests[dep][stat["name"]] = requests[dep].get(stat["name"], 0) + stat.get("requests", 0)
    pools = {pk: _adapter_fields(adapters.get(pk, []), requests.get(pk, {})) for pk in deployments}
    # Deployment.serving_dtype and .adapter_pool_bytes, from plain values (no instances here).
    for pk, host_id, dep_id, index, reserved, state, mps, held in replicas:
        if dep_id not in deployments:  # deleted, with its replicas, since they were read: the delete marked the host
            continue
        (name, path, architecture, dtype, stored_dtype, batch, seq, max_batch_size, delay, engine, engine_args,
         revision, refusals, shape, task) = deployments[dep_id]
        row = {
            "id": pk, "deployment": name, "index": index, "model_path": path, "architecture": architecture,
            "gpus": sorted(gpus.get(pk, ())), "reserved_bytes": reserved, "state": state,
            "dtype": dtype or stored_dtype, "batch": batch, "seq": seq, "mps_percentage": mps,
            "max_batch_size": max_batch_size, "max_batch_delay_ms": float(delay), **pools[dep_id]}
        if held:  # a rollout has not reached it yet: it is told to run what it runs (console/control/rollout.py)
            revision, row["model_path"] = held["revision"], held["model_path"]
            row["adapters"] = [a | {"path": held["adapters"][a["name"]]} for a in row["adapters"]
                               if a["name"] in held["adapters"]]
        if revision:  # left out at 0, as the engine at its default: an agent from before revisions refuses it
            row["revision"] = revision
        runs = engine_on(engine, task, engines.get(host_id) or {}, host_id in with_gpus, refusals,
                         (shape or {}).get("format"))
        if runs != BUILTIN.name:  # the default, left out: an agent from before engines refuses fields it does not know
            row["engine"] = runs
            if engine_args:
                row["engine_args"] = engine_args
        out[host_id].append(row)
    return out


def engine_on(engine: str, task: str, host_engines: dict, real_gpus: bool = True,
              refusals: dict | None = None, model_format: str | None = None) -> str:
    """What runs a replica of a deployment with this `engine` on a host running `host_engines`: as asked, or for
    "auto", the engine auto picks there (agent.engines.auto_engine: vLLM for a causal LM where the host runs it on
    real GPUs) unless its capability check refused the model there (`refusals`: its Model.engine_refusals), else
    the built-in engine; for a model of another format (`model_format`), an engine that reads it. `task`: the
    model's, as registered."""
    if engine != AUTO:
        return engine
    return auto_engine(host_engines, task, real_gpus, refusals, model_format)


def _adapter_fields(adapters: list[tuple[str, str, bool, int]], requests: dict[str, int]) -> dict:
    pool = sum(nbytes for *_, nbytes in adapters)
    return {
        "adapters": [{"name": name, "path": path, "pinned": pinned} for name, path, pinned, _ in adapters],
        "adapter_pool_bytes": pool,
        "adapter_host_bytes": 4 * pool,
        "adapter_hints": popular_adapters(requests, {name: nbytes for name, _, _, nbytes in adapters}, pool),
    }


def popular_adapters(requests: dict[str, int], sizes: dict[str, int], pool_bytes: int) -> dict[str, float]:
    """The adapters most requested across the deployment's replicas (`requests`, by adapter name), as many as its
    device tier holds: a replica that starts (or a pool that evicted them) prefetches these first. Only the set is
    sent, not the counts, so the desired state changes when the favourites change, not with every request."""
    hints, room = {}, pool_bytes
    for name in sorted((n for n in requests if n in sizes and requests[n]), key=lambda n: (-requests[n], n)):
        if sizes[name] <= room:
            hints[name], room = 1.0, room - sizes[name]
    return hints


def gateway_secret(host: Host) -> str:
    """The secret the host's agent's inference port accepts (only the console's gateway knows it); read afresh,
    so a rotated token's secret is what the next push carries."""
    credential = AgentCredential.objects.filter(host_name=host.name).first()
    return credential.gateway_secret if credential is not None else ""


def replicas_text(rows: list[dict]) -> JsonText:
    """A host's desired replicas as the JSON text that is hashed, stored and pushed: one spelling everywhere, so a
    state built now reads exactly as the one a pass stored."""
    return JsonText(json.dumps(rows, sort_keys=True))


def desired_text(host: Host) -> tuple[int, str]:
    """The desired state a host was last given, as a push sends it: (its generation, its replicas' JSON text),
    the text the scheduler pass stored; built now where marked stale or never stored (the next pass stores it
    under a new generation). What a new link sends first: a fleet reconnecting after a console restart reads
    each host's text, where validating and serializing its replicas again cost every hello its CPU."""
    stored = stored_states([host.pk]).get(host.pk)
    if stored is not None:
        return stored
    generation = Host.objects.filter(pk=host.pk).values_list("generation", flat=True).first() or 0
    return generation, replicas_text(desired_rows_by_host([host.pk])[host.pk])


def desired_state(host: Host) -> DesiredState:
    """desired_text as the protocol's message, with the secret its agent's inference port accepts."""
    generation, replicas = desired_text(host)
    return DesiredState(generation=generation, gateway_secret=gateway_secret(host),
                        replicas=[DesiredReplica.model_validate(r) for r in json.loads(replicas)])


def stored_states(host_ids) -> dict[int, tuple[int, str]]:
    """The desired states stored for these hosts, as bump_generations returns them (generation, the replicas' JSON
    text), in one read; a host marked stale or never given one is left out (desired_state builds it). Read as
    text: the push sends it as it is, never decoded and encoded again."""
    rows = (Host.objects.filter(pk__in=list(host_ids)).exclude(desired_digest="")
            .values_list("pk", "generation", Cast("desired__replicas", TextField())))
    return {pk: (generation, replicas) for pk, generation, replicas in rows if replicas is not None}


def mark_stale(deployments) -> None:
    """These deployments' specs changed (their settings, their adapters, their model): the hosts running them get
    their desired state rebuilt by the next pass, which otherwise rebuilds only hosts whose replicas it moved.
    `deployments`: a list or a queryset of them (one statement either way)."""
    update_in_key_order(Host.objects.filter(replicas__deployment__in=deployments), desired_digest="")


def bump_generations(host_ids=None) -> dict[int, tuple[int, str]]:
    """Rebuild the desired state of these hosts (None: every host, plus any marked stale) and give each whose
    state changed a new generation, storing what is pushed; returns, per host that got one, its generation and
    its desired replicas' JSON text as stored (the push sends it without reading it back). The text is the one
    the digest hashes: serialized once, not again to store it and once more on the event loop for each push
    (40 us a host of ten replicas each time: 1,000 hosts' wave held the loop 40 ms more before its last push)."""
    hosts = Host.objects.all() if host_ids is None else Host.objects.filter(Q(pk__in=list(host_ids)) |
                                                                             Q(desired_digest=""))
    hosts = list(hosts.only("pk", "generation", "desired_digest").order_by("pk"))  # by key, as intake locks hosts
    built = desired_rows_by_host([h.pk for h in hosts])
    bumps = []  # (host, its new digest, its replicas' JSON text)
    for host in hosts:
        replicas = replicas_text(built[host.pk])
        digest = hashlib.sha256(replicas.encode()).hexdigest()
        if digest != host.desired_digest:
            bumps.append((host, digest, replicas))
    if not bumps:
        return {}
    # What is pushed is stored first (its rows are the pass's own): the host rows below stay locked from their
    # UPDATE until the pass commits, and intake's leases and acks wait for them, so they are written last and fast
    # (conditional UPDATEs, pipelined; storing 1,000 hosts' states after them held those rows 0.1-0.75 s longer).
    upsert_values(HostDesired, ("replicas",), [(host.pk, replicas) for host, _, replicas in bumps])
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {q(Host._meta.db_table)} SET {q('desired_digest')} = %s, {q('generation')} = %s "
                           f"WHERE {q('id')} = %s AND {q('desired_digest')} = %s",
                           [(digest, host.generation + 1, host.pk, host.desired_digest) for host, digest, _ in bumps])
    written = set(Host.objects.filter(pk__in=[host.pk for host, _, _ in bumps])
              .values_list("pk", "desired_digest", "generation"))
    lost = {host.pk for host, digest, _ in bumps if (host.pk, digest, host.generation + 1) not in written}
    if lost:
        # Marked stale meanwhile (a deployment changed), or bumped by another pass: the state stored above may
        # not be what their generation says, so they are marked stale and the next pass gives them a new one.
        update_in_key_order(Host.objects.filter(pk__in=lost), desired_digest="")
    return {host.pk: (host.generation + 1, replicas) for host, _, replicas in bumps if host.pk not in lost}
