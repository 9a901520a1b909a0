"""What an operator sees of what happened, in headless Chromium against a real `manage.py up`: a critical
deployment preempts a batch one, and the preemption, with its preemptor, is still on the events page and on the
preempted deployment's page many scheduler passes later (its replica's own reason has moved on by then); the
traffic the test sent through the gateway is on the deployment's request-rate chart. (The failed replica's own
error and log tail: tests/e2e/test_worker_logs_browser.py.)"""

import os
import re

import httpx
import openai
import pytest
from playwright.async_api import async_playwright, expect

from tests.e2e.stack import ADMIN_PASSWORD, start, wait_for
from tests.e2e.test_dashboard_browser import ARGS, CHROMIUM

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
REQUESTS = 12


def replica(api, name) -> dict:
    body = api.get(f"/deployments/{name}").json()
    return body["replicas"][0] if body.get("replicas") else {}


def passes(stack) -> float:
    """Scheduler passes so far, from the console's own /metrics."""
    text = httpx.get(stack.url + "metrics", headers={"Authorization": f"Bearer {stack.token}"}, timeout=30).text
    return float(re.search(r"^modelgrid_scheduler_pass_seconds_count (\S+)$", text, re.M).group(1))


@pytest.fixture
def preempted(tiny_llama, tmp_path):
    """One simulated GPU with room for one tiny Llama replica: `bulk` (batch) served traffic, then `vital`
    (critical) took its GPU; fifty passes have run since (the stack passes every 0.2 s: at the default
    MODELGRID_SCHEDULER_INTERVAL of 5 s that is four minutes of passes)."""
    stack, drop_db = start(tmp_path / "data", gpus="sim:1x3MiB")
    try:
        api = stack.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        assert api.post("/deployments", json={"name": "bulk", "model": "tiny", "priority": "batch"}).status_code == 201
        wait_for(lambda: replica(api, "bulk").get("state") == "ready", 120, what="bulk to be ready")
        client = openai.OpenAI(base_url=stack.url + "v1", api_key=stack.token, max_retries=0)
        for i in range(REQUESTS):
            assert client.completions.create(model="bulk", prompt=f"Once upon a time {i}", max_tokens=4).choices
        vital = api.post("/deployments", json={"name": "vital", "model": "tiny", "priority": "critical"})
        assert vital.status_code == 201, vital.text
        wait_for(lambda: replica(api, "bulk").get("state") == "sleeping", 120, what="bulk to be put to sleep")
        after = passes(stack)
        wait_for(lambda: passes(stack) >= after + 50, 120, interval=1, what="50 more scheduler passes")
        yield stack, api
    finally:
        stack.stop()
        drop_db()


async def test_a_preemption_and_its_preemptor_stay_on_the_timeline_and_the_traffic_on_the_chart(preempted):
    stack, api = preempted
    assert "preempted by" not in replica(api, "bulk")["reason"]  # the replica's own reason has moved on
    shots = os.environ.get("MODELGRID_SCREENSHOTS")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(20_000)
        try:
            await page.goto(stack.url + "events/")
            await page.fill("input[name=username]", "admin")
            await page.fill("input[name=password]", ADMIN_PASSWORD)
            await page.click("button[type=submit]")
            await expect(page.locator("h1")).to_have_text("Events")
            await page.locator("select[name=reason]").select_option("Preempted")
            row = page.locator('tr.event[data-reason="Preempted"][data-object="replica/bulk#0"]')
            await expect(row).to_have_count(1)
            await expect(row.locator(".message")).to_contain_text("preempted by vital#0 (critical")
            await expect(row.locator(".actor")).to_have_text("scheduler")
            await expect(page.locator('tr.event:not([data-reason="Preempted"])')).to_have_count(0)
            await page.locator("select[name=reason]").select_option("")
            if shots:
                await page.screenshot(path=os.path.join(shots, "events.png"), full_page=True)

            await row.locator(".object a").click()  # the event links to its deployment
            await expect(page.locator("h1")).to_have_text("bulk")
            card = page.locator("#events")
            await expect(card.locator('tr.event[data-reason="Preempted"] .message')).to_contain_text(
                "preempted by vital#0 (critical")
            await expect(card.locator('tr.event[data-reason="Placed"]')).to_have_count(1)
            await expect(page.locator("#deployment-status .pill.state-asleep").first).to_be_visible()

            chart = page.locator('figure[data-chart="request_rate"]')
            # The console samples every 10 s and the card is polled as often: the traffic shows within a minute.
            for _ in range(12):
                if float(await chart.get_attribute("data-max") or 0) > 0:
                    break
                await page.wait_for_timeout(5_000)
                await page.reload()
            assert float(await chart.get_attribute("data-max") or 0) > 0, "no traffic on the request-rate chart"
            assert int(await chart.get_attribute("data-points")) > 0
            await expect(chart.locator("path.line")).not_to_have_count(0)
            if shots:
                await page.locator("#events").screenshot(path=os.path.join(shots, "deployment-events.png"))
                await page.locator("section.charts").first.screenshot(path=os.path.join(shots, "charts.png"))
        finally:
            await browser.close()
