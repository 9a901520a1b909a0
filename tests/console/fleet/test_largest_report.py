"""Whatever the protocol accepts, the console shows and judges: after reports at the protocol's bounds (as many GPUs
per host as it allows, each as large as it allows, from enough hosts that their memory overflows a 64-bit sum) the
dashboard renders, the fleet's figures add up, and alert evaluation runs."""

import json
import math
import re

import pytest
from django.utils import timezone

from agent.protocol import GpuInfo, Hello, HostReport, parse_agent_message
from console.accounts.scope import TeamScope
from console.alerts.evaluate import evaluate
from console.alerts.models import Alert
from console.fleet.models import AgentCredential, Gpu, Host
from console.fleet.presenters import fleet_summary
from console.intake import stages as intake

pytestmark = pytest.mark.django_db


def _bound(field, kind: str) -> int:
    """A field's bound as the protocol's schema states it (`le` of a number, `max_length` of a list)."""
    return next(getattr(m, kind) for m in field.metadata if getattr(m, kind, None) is not None)


MAX_BYTES = _bound(GpuInfo.model_fields["total_bytes"], "le")
MAX_GPUS = _bound(HostReport.model_fields["gpus"], "max_length")
HOSTS = math.ceil(2**63 / (MAX_GPUS * MAX_BYTES)) + 1  # their sum overflows a 64-bit integer


def largest_hosts() -> None:
    """HOSTS hosts that said hello and reported the largest GPUs the protocol accepts, all their memory used by
    processes ModelGrid does not own; each message through the wire parser, as the agent link takes it."""
    for h in range(HOSTS):
        name = f"big{h}"
        gpus = [GpuInfo(index=i, uuid=f"GPU-{h}-{i}", name="x" * 200, total_bytes=MAX_BYTES, used_bytes=MAX_BYTES,
                        own_bytes=0, utilization=100.0, simulated=False) for i in range(MAX_GPUS)]
        hello = parse_agent_message(json.dumps(Hello(protocol=1, host=name, agent_version="1",
                                                     endpoint="http://127.0.0.1:9", gpus=gpus).model_dump()))
        host, _ = intake.register_hello(AgentCredential.issue(name)[0], hello)
        report = parse_agent_message(HostReport(gpus=gpus, ram_free_bytes=2**63 - 1).model_dump_json())
        assert [o.error for o in intake.apply_batch([intake.Item(host.pk, name, report)])] == [None]


def test_the_dashboard_and_alert_evaluation_survive_reports_at_the_protocols_bounds(user_client):
    largest_hosts()
    assert Gpu.objects.count() == HOSTS * MAX_GPUS
    page = user_client.get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-host="big0"' in html and "100.0%" in html
    assert user_client.get("/hosts/big0/").status_code == 200
    memory = fleet_summary(TeamScope())["memory"]
    assert memory["total_bytes"] == pytest.approx(HOSTS * MAX_GPUS * MAX_BYTES, rel=1e-9)
    assert memory["used_pct"] == 100.0
    evaluate(timezone.now())  # every rule, the foreign-memory one reading every host above its threshold
    assert Host.objects.count() == HOSTS and not Alert.objects.filter(rule__kind="foreign_memory_growing").exists()


def test_rows_stored_under_older_wider_bounds_still_render_and_are_judged(user_client, host):
    # Before the bounds were tightened a GPU could be stored with 2**63 - 1 bytes, and an agent may say it uses
    # more than it has: the bar stops at the GPU's edge, and the sums still add up.
    big = 2**63 - 1
    Gpu.objects.filter(host=host).update(total_bytes=big, used_bytes=big, own_bytes=0)
    Gpu.objects.create(host=host, index=7, uuid="SIM-7", name="sim", total_bytes=1 << 30, used_bytes=big, own_bytes=0)
    html = user_client.get("/").content.decode()
    widths = [float(w) for w in re.findall(r'class="seg foreign" style="width: ([\d.]+)%"', html)]
    assert widths and max(widths) <= 100
    assert fleet_summary(TeamScope())["memory"]["total_bytes"] == pytest.approx(2 * big + (1 << 30), rel=1e-9)
    evaluate(timezone.now())
