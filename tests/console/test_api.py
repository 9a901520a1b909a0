"""console/api.py: what any REST operation answers to a request it cannot take, before any view runs."""

import json

import pytest
from django.conf import settings

from console.catalog.models import Model
from console.deployments.models import Deployment
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
MiB = 1024 * 1024


@pytest.mark.parametrize("url, method", [("/api/v1/models", "post"), ("/api/v1/deployments", "post"),
                                         ("/api/v1/deployments/bulk", "post"), ("/api/v1/deployments/chat", "patch"),
                                         ("/api/v1/plan", "post"), ("/api/v1/estimate", "post")])
def test_a_body_over_the_limit_is_a_413_that_names_the_limit_and_stores_nothing(client, api, url, method):
    body = json.dumps({"name": "big", "path": "x" * (15 * MiB)})
    r = getattr(client, method)(url, data=body, content_type="application/json", **api.auth)
    assert r.status_code == 413, r.content[:500]
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert r.json()["detail"][0]["type"] == "request_too_large"
    assert f"{limit:,} bytes" in refusal(r)
    assert not Model.objects.exists() and not Deployment.objects.exists()


def test_without_a_token_a_body_over_the_limit_is_refused_as_unauthenticated(client):
    # Who asks is checked first: a stranger's giant body is never parsed.
    r = client.post("/api/v1/models", data="x" * (15 * MiB), content_type="application/json")
    assert r.status_code == 401 and r.json()["detail"][0]["type"] == "unauthorized"


def test_a_body_just_under_the_limit_is_read(api):
    # What is refused is the size, not the request: a body under the limit gets the usual 422.
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    r = api.post("/api/v1/models", {"name": "big", "path": "x" * (limit - 100)})
    assert r.status_code == 422, r.content[:500]
