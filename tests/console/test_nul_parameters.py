"""Every operation of the published API with a NUL in each of its free-text parameters and body fields: an
answer, never a 500. PostgreSQL refuses a NUL in a query (schemathesis found three such 500s one at a time, and
a probe a fourth); this walks the whole schema at once so a new parameter cannot bring the bug back. Fails only on
PostgreSQL (the db_stack run): SQLite compares such strings without complaint."""

import json
from pathlib import Path
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.django_db

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())
NUL = "ch\x00at"


def free_text(param: dict) -> bool:
    schema = param.get("schema", {})
    options = schema.get("anyOf", [schema])
    return any(o.get("type") == "string" and "enum" not in o for o in options)


def plain_path_values(params: list[dict]) -> dict[str, str]:
    """A harmless value for each path parameter (an alert rule that exists: else its body is never read)."""
    plain = {p["name"]: "1" if p.get("schema", {}).get("type") == "integer" else "chat"
             for p in params if p["in"] == "path"}
    return plain | ({"kind": "host_offline"} if "kind" in plain else {})


def cases() -> list[tuple[str, str, str]]:
    """(method, path, query) with a NUL in one free-text parameter; other path parameters get a plain value."""
    found = []
    for path, ops in SCHEMA["paths"].items():
        for method, op in ops.items():
            params = op.get("parameters", [])
            plain = plain_path_values(params)
            for p in filter(free_text, params):
                values = plain | ({p["name"]: NUL} if p["in"] == "path" else {})
                url = path.format(**{k: quote(v, safe="") for k, v in values.items()})
                query = f"{p['name']}={quote(NUL)}" if p["in"] == "query" else ""
                found.append((method, url, query))
    return found


@pytest.mark.parametrize("method, url, query", cases())
def test_a_nul_in_a_parameter_is_answered_not_a_server_error(api, method, url, query):
    target = f"{url}?{query}" if query else url
    r = {"get": api.get, "delete": api.delete}.get(method, lambda u: getattr(api, method)(u, {}))(target)
    assert r.status_code < 500, (method, target, r.status_code, r.content[:300])


def body_cases() -> list[tuple[str, str, str]]:
    """(method, path, field): each free-text field of a request body, sent alone holding a NUL. Alone: a body
    with required fields besides is refused before it reaches the database, so this covers bodies whose fields
    are all optional (a rule's patch, a deployment's), where a NUL reached PostgreSQL."""
    schemas = SCHEMA["components"]["schemas"]
    found = []
    for path, ops in SCHEMA["paths"].items():
        for method, op in ops.items():
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            props = schemas[ref["$ref"].rsplit("/", 1)[1]].get("properties", {}) if "$ref" in ref else {}
            plain = plain_path_values(op.get("parameters", []))
            found += [(method, path.format(**plain), name) for name, prop in props.items() if free_text(
                {"schema": prop})]
    return found


@pytest.mark.parametrize("method, url, field", body_cases())
@pytest.mark.parametrize("value", [NUL, f"http://{NUL}"])  # the second passes a URL field's pattern
def test_a_nul_in_a_body_field_is_answered_not_a_server_error(api, method, url, field, value):
    r = getattr(api, method)(url, {field: value})
    assert r.status_code < 500, (method, url, field, r.status_code, r.content[:300])


def test_the_cases_cover_the_parameters_found_so_far():
    """The walks reach what were 500s on PostgreSQL (q, a model's name, the events' reason, a webhook URL)."""
    seen = {(m, u.split("?")[0], q.split("=")[0]) for m, u, q in cases()}
    assert ("get", "/api/v1/events", "reason") in seen and ("get", "/api/v1/deployments", "q") in seen
    assert ("get", "/api/v1/models/ch%00at", "") in seen
    assert ("patch", "/api/v1/alerts/rules/host_offline", "webhook_url") in body_cases()
