"""GET /api/v1/deployments/{name}/series and /api/v1/hosts/{name}/series."""

import time
from datetime import UTC, datetime

import pytest
from django.test import Client

from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from console.series.sampler import sample

pytestmark = pytest.mark.django_db
GiB = 1 << 30


@pytest.fixture
def recorded(host, model):
    """Three ticks, 10 s apart, ending now: chat's traffic goes 0 -> 5 req/s at the second."""
    create_deployment("chat", "tiny")
    start = int(time.time()) - 20
    for i, rate in enumerate((0.0, 5.0, 5.0)):
        Deployment.objects.filter(name="chat").update(traffic_rps=rate)
        sample(datetime.fromtimestamp(start + 10 * i, tz=UTC))
    return start


def test_a_deployment_series_is_metric_unit_resolution_and_points(api, recorded):
    r = api.get(f"/api/v1/deployments/chat/series?metric=request_rate&since={recorded - 5}")
    assert r.status_code == 200, r.content
    assert r.json() == {"metric": "request_rate", "unit": "req/s", "resolution_s": 10,
                        "points": [[recorded, 0.0], [recorded + 10, 5.0], [recorded + 20, 5.0]]}


def test_since_is_unix_seconds_or_iso_8601(api, recorded):
    iso = datetime.fromtimestamp(recorded + 15, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for since in (str(recorded + 15), iso, iso.removesuffix("Z")):
        points = api.get(f"/api/v1/deployments/chat/series?metric=request_rate&since={since}").json()["points"]
        assert points == [[recorded + 15, 5.0], [recorded + 20, 5.0]], since


def test_the_default_range_is_the_last_hour(api, recorded):
    points = api.get("/api/v1/deployments/chat/series?metric=replicas").json()["points"]
    assert points[0][0] == recorded and all(isinstance(v, int) for _, v in points)


def test_a_long_range_answers_five_minute_points(api, recorded):
    r = api.get(f"/api/v1/deployments/chat/series?metric=request_rate&since={recorded - 3 * 86400}").json()
    assert r["resolution_s"] == 300


def test_a_host_series_in_whole_bytes(api, recorded, host):
    r = api.get(f"/api/v1/hosts/{host.name}/series?metric=total_bytes&since={recorded - 5}").json()
    assert r["unit"] == "bytes" and r["points"][0] == [recorded, 32 * GiB]


def test_an_unknown_deployment_or_host_is_a_404_in_the_one_error_shape(api, recorded):
    for url in ("/api/v1/deployments/ghost/series?metric=p95_ms", "/api/v1/hosts/ghost/series?metric=utilization"):
        r = api.get(url)
        assert r.status_code == 404
        assert r.json()["detail"][0]["type"] == "not_found" and "ghost" in r.json()["detail"][0]["msg"]


def test_an_unknown_metric_is_a_422_naming_the_allowed_ones(api, recorded, host):
    r = api.get("/api/v1/deployments/chat/series?metric=reserved_bytes")
    assert r.status_code == 422
    item = r.json()["detail"][0]
    assert item["loc"] == ["query", "metric"] and "'request_rate'" in item["msg"] and "'replicas'" in item["msg"]
    r = api.get(f"/api/v1/hosts/{host.name}/series?metric=p95_ms")
    assert r.status_code == 422 and "'foreign_bytes'" in r.json()["detail"][0]["msg"]


def test_a_since_that_is_no_time_is_a_422(api, recorded):
    for since in ("yesterday", "nan", "inf"):
        r = api.get(f"/api/v1/deployments/chat/series?metric=p95_ms&since={since}")
        assert r.status_code == 422, since
        assert r.json()["detail"][0]["loc"] == ["query", "since"]


def test_a_since_in_the_future_has_no_points(api, recorded):
    r = api.get(f"/api/v1/deployments/chat/series?metric=request_rate&since={recorded + 3600}")
    assert r.status_code == 200 and r.json()["points"] == []


def test_it_needs_a_token_or_a_session(recorded, user_client):
    url = "/api/v1/deployments/chat/series?metric=request_rate"
    assert Client().get(url).status_code == 401
    assert user_client.get(url).status_code == 200
