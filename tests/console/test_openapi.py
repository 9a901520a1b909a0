"""The published API schema (docs/openapi.json) must match the code; regenerate it with
`python manage.py export_openapi_schema --api console.api.api --indent 2 --sorted --output docs/openapi.json`."""

import json
from pathlib import Path

from console.api import api

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_published_schema_matches_the_code():
    current = json.loads(json.dumps(api.get_openapi_schema(), sort_keys=True, default=str))
    assert current == json.loads(DOC.read_text()), "API changed: regenerate docs/openapi.json (see module docstring)"


def test_every_operation_requires_authentication():
    schema = api.get_openapi_schema()
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            assert op.get("security"), f"{method.upper()} {path} has no security requirement"
