"""Each protocol field that lands in a console column is bounded within that column's range on every database
backend, so a message that passes validation can always be stored (PostgreSQL's integer is 32-bit signed)."""

import pytest
from django.db import connection

from agent.protocol import Ack, DesiredReplica, GpuInfo, Hello, HostReport, Measurement, ReplicaStatus
from console.catalog.models import MemorySample
from console.deployments.models import Deployment, Replica
from console.fleet.models import Gpu, Host

# (protocol model, field) -> (model, column) it is written to or compared with.
LANDS_IN = {
    (GpuInfo, "index"): (Gpu, "index"),
    (GpuInfo, "total_bytes"): (Gpu, "total_bytes"),
    (GpuInfo, "used_bytes"): (Gpu, "used_bytes"),
    (GpuInfo, "own_bytes"): (Gpu, "own_bytes"),
    (GpuInfo, "uuid"): (Gpu, "uuid"),
    (GpuInfo, "name"): (Gpu, "name"),
    (Hello, "host"): (Host, "name"),
    (Hello, "agent_version"): (Host, "agent_version"),
    (Hello, "endpoint"): (Host, "endpoint"),
    (HostReport, "ram_free_bytes"): (Host, "ram_free_bytes"),
    (Ack, "generation"): (Host, "acked_generation"),
    (ReplicaStatus, "replica_id"): (Replica, "id"),
    (ReplicaStatus, "measured_bytes"): (Replica, "measured_bytes"),
    (ReplicaStatus, "loaded_bytes"): (Replica, "loaded_bytes"),
    (ReplicaStatus, "total_bytes"): (Replica, "loading_total_bytes"),
    (ReplicaStatus, "host_bytes"): (Replica, "host_bytes"),
    (ReplicaStatus, "pid"): (Replica, "pid"),
    (ReplicaStatus, "mps_percentage"): (Replica, "mps_percentage"),
    (Measurement, "batch"): (MemorySample, "batch"),
    (Measurement, "seq"): (MemorySample, "seq"),
    (Measurement, "total_bytes"): (MemorySample, "measured_bytes"),
    (DesiredReplica, "id"): (Replica, "id"),
    (DesiredReplica, "reserved_bytes"): (Replica, "reserved_bytes"),
    (DesiredReplica, "batch"): (Deployment, "batch"),
    (DesiredReplica, "seq"): (Deployment, "seq"),
    (DesiredReplica, "max_batch_size"): (Deployment, "max_batch_size"),
    (DesiredReplica, "mps_percentage"): (Replica, "mps_percentage"),
}


def schema_of(message, field: str) -> dict:
    """The JSON schema of one field, without its `null` alternative."""
    prop = message.model_json_schema()["properties"][field]
    choices = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    assert len(choices) == 1, f"{message.__name__}.{field}: {prop}"
    return choices[0]


@pytest.mark.parametrize(("message", "field"), LANDS_IN.keys(), ids=[f"{m.__name__}.{f}" for m, f in LANDS_IN])
def test_the_field_fits_its_column(message, field):
    model, column = LANDS_IN[(message, field)]
    db_field = model._meta.get_field(column)
    schema = schema_of(message, field)
    if schema["type"] == "integer":
        low, high = connection.ops.integer_field_range(db_field.get_internal_type())
        assert "minimum" in schema and "maximum" in schema, f"{message.__name__}.{field} is unbounded"
        assert low is None or schema["minimum"] >= low
        assert high is None or schema["maximum"] <= high
        # PostgreSQL's ranges, whatever the backend running this test: the same bound must hold there.
        from django.db.backends.base.operations import BaseDatabaseOperations

        pg_low, pg_high = BaseDatabaseOperations.integer_field_ranges[db_field.get_internal_type()]
        assert schema["minimum"] >= pg_low and schema["maximum"] <= pg_high
    else:
        assert schema["type"] == "string"
        assert schema.get("maxLength", 1 << 40) <= db_field.max_length, f"{message.__name__}.{field} too long"


def test_every_integer_and_list_an_agent_sends_is_bounded():
    def walk(schema: dict, defs: dict, where: str):
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            if name not in seen:
                seen.add(name)
                yield from walk(defs[name], defs, name)
            return
        for choice in schema.get("anyOf", []):
            yield from walk(choice, defs, where)
        kind = schema.get("type")
        if kind == "integer" and not {"minimum", "maximum"} <= schema.keys():
            yield where
        if kind == "array":
            if "maxItems" not in schema:
                yield where
            yield from walk(schema["items"], defs, where + "[]")
        if kind == "string" and "maxLength" not in schema and "enum" not in schema and "const" not in schema:
            yield where
        for name, prop in schema.get("properties", {}).items():
            yield from walk(prop, defs, f"{where}.{name}")

    unbounded = []
    for message in (Hello, HostReport, ReplicaStatus, Ack):
        seen: set[str] = set()
        full = message.model_json_schema()
        unbounded += list(walk(full, full.get("$defs", {}), message.__name__))
    assert unbounded == []
