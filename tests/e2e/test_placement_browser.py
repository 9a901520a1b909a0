"""Placement in headless Chromium: a deployment's two replicas spread over the host's two GPUs on the grid, then a
taint set from the host's page, shown there and on the dashboard, keeping a deployment that does not tolerate it
off the host (its refusal names the taint)."""

import pytest
from playwright.async_api import expect

from tests.e2e.browser import signed_in
from tests.e2e.stack import remove
from tests.waiting import until

pytestmark = pytest.mark.browser


def _reason(api, name: str) -> str:
    body = api.get(f"/deployments/{name}").json()
    return body["reason"] if body["state"] == "unschedulable" else ""


async def test_spread_shows_on_the_grid_and_a_taint_keeps_the_host(stack):
    with stack.api() as api:
        path = str(stack.data_dir / "models" / "tiny-llama")
        model = api.post("/models", json={"name": "spread-model", "path": path})
        assert model.status_code in (201, 409), model.text
        created = api.post("/deployments", json={"name": "spread-demo", "model": "spread-model", "replicas": 2})
        assert created.status_code == 201, created.text
    try:
        async with signed_in(stack.url) as page:
            await expect(page.locator("h1")).to_have_text("GPU fleet")
            for gpu in ("local/0", "local/1"):  # one replica on each GPU, not both on the one the first tightened
                segment = page.locator(f'.gpu[data-gpu="{gpu}"] .seg[data-deployment="spread-demo"]')
                await expect(segment).to_have_count(1, timeout=120_000)

            await page.goto(stack.url + "hosts/local/")
            await page.fill("#placement input[name=taints]", "pool=ml")
            await page.locator("#placement button[type=submit]").click()
            await expect(page.locator(".msg-success")).to_contain_text("Saved taints")
            await expect(page.locator('.host .label.taint[data-taint="pool=ml"]')).to_have_text("taint pool=ml")
            await page.goto(stack.url)
            await expect(page.locator('.host .label.taint[data-taint="pool=ml"]')).to_be_visible()

            with stack.api() as api:
                created = api.post("/deployments", json={"name": "untolerated", "model": "spread-model"})
                assert created.status_code == 201, created.text
                await until(lambda: _reason(api, "untolerated"), 30, "untolerated to be refused", every=0.2)
                assert "excluded by taint pool=ml (not tolerated)" in _reason(api, "untolerated")
            await expect(page.locator('tr[data-deployment="untolerated"] .pill')).to_have_text("unschedulable")
    finally:
        with stack.admin_api() as admin:
            assert admin.patch("/hosts/local", json={"taints": {}}).status_code == 200
        with stack.api() as api:
            remove(api, deployments=("untolerated", "spread-demo"), models=("spread-model",))
