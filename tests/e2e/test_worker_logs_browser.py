"""The deployment page's Worker logs card in headless Chromium: a replica that fails to load shows the worker's
own error in the live tail, a replica added later joins its picker live, and choosing a replica that is not there
shows why in words."""

import os

import pytest
from playwright.async_api import async_playwright, expect

from tests.e2e.stack import ADMIN_PASSWORD, wait_for
from tests.e2e.test_dashboard_browser import ARGS, CHROMIUM
from tests.e2e.test_worker_logs import WORKERS_ERROR, mismatched

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.db_stack]


async def test_the_log_tail_of_a_replica_that_failed_shows_the_workers_error(stack, tiny_llama, tmp_path):
    api = stack.api()
    path = mismatched(api, tiny_llama, tmp_path / "wide-mlp-page", "wide-mlp-page")
    assert api.post("/deployments", json={"name": "broken-page", "model": "wide-mlp-page"}).status_code == 201
    try:
        wait_for(lambda: any(r["state"] == "failed" for r in api.get("/deployments/broken-page").json()["replicas"]),
                 timeout=120, what="broken-page's replica to fail to load")
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(20_000)
            try:
                await page.goto(stack.url + "deployments/broken-page/")
                await page.fill("input[name=username]", "admin")
                await page.fill("input[name=password]", ADMIN_PASSWORD)
                await page.click("button[type=submit]")
                # The replica says why it failed in the worker's own words (its agent's, not the scheduler's) ...
                # (The agent restarts it after a backoff, so the page may open on a retry still starting: it shows
                # the failure once the retry fails too, live. A slow machine takes seconds per load.)
                await expect(page.locator("#replicas .observed-reason")).to_contain_text(
                    WORKERS_ERROR, timeout=60_000)
                await expect(page.locator("#events tr.event[data-reason=Failed] .message").first).to_contain_text(
                    WORKERS_ERROR)
                # ... and its log tail has the traceback.
                card = page.locator("#worker-logs")
                await expect(card.locator("h2")).to_contain_text("Worker logs")
                lines = card.locator(".log-lines")
                await expect(lines).to_contain_text(f"cannot load {path}")
                await expect(lines).to_contain_text(WORKERS_ERROR)
                # A second replica joins the picker without a reload; chosen, it stays chosen while the picker is
                # drawn again for its next state.
                assert api.patch("/deployments/broken-page", json={"replicas": 2, "max_replicas": 2}).status_code == 200
                second = card.locator("#log-replica option[value='1']")
                await expect(second).to_have_count(1, timeout=30_000)
                await card.locator("#log-replica").select_option("1")
                await expect(second).not_to_have_text(await second.text_content(), timeout=60_000)
                await expect(card.locator("#log-replica")).to_have_value("1")
                if os.environ.get("MODELGRID_SCREENSHOTS"):
                    await card.screenshot(path=os.path.join(os.environ["MODELGRID_SCREENSHOTS"], "worker-logs.png"))
            finally:
                await browser.close()
    finally:
        assert api.delete("/deployments/broken-page").status_code == 204
