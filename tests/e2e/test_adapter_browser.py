"""Adapters added from the deployment page in headless Chromium, while its replica runs: the first, then one of a
larger rank than the replica's pool was sized for, which is served through the console's gateway (not refused as
"not loaded in this replica") and shows on the page as held by the replica."""

import time

import pytest
from playwright.async_api import expect

from tests.e2e.browser import signed_in
from tests.e2e.stack import remove, wait_for
from tests.e2e.test_adapter_growth import ids_body, lora, only_replica

pytestmark = pytest.mark.browser


async def add_adapter(page, name: str, path: str) -> None:
    form = page.locator("#adapters form.row").last
    await form.locator("input[name=name]").fill(name)
    await form.locator("input[name=path]").fill(path)
    await form.locator("button[type=submit]").click()
    await expect(page.locator(f'tr[data-adapter="{name}"]')).to_be_visible()


async def test_an_adapter_added_from_the_page_to_a_running_replica_is_served(stack, tiny_llama, tmp_path):
    api = stack.api()
    assert api.post("/models", json={"name": "ui-base", "path": str(tiny_llama)}).status_code in (201, 409)
    assert api.post("/deployments", json={"name": "ui-grows", "model": "ui-base"}).status_code == 201
    try:
        async with signed_in(stack.url + "deployments/ui-grows/", height=1000) as page:
            await expect(page.locator("h1")).to_contain_text("ui-grows")
            await add_adapter(page, "ui-small", str(lora(tmp_path, "small", 2, seed=1)))
            wait_for(lambda: only_replica(api, "ui-grows").get("state") == "ready", timeout=120,
                     what="the replica to be ready")
            with stack.gateway() as gateway:
                wait_for(lambda: gateway.post("/v2/models/ui-small/infer", json=ids_body([1, 5, 9])).status_code
                         == 200, timeout=60, what="the first adapter to be served")
                pid = only_replica(api, "ui-grows")["pid"]

                await add_adapter(page, "ui-big", str(lora(tmp_path, "big", 32, seed=2)))
                await expect(page.locator('tr[data-adapter="ui-big"] td').nth(1)).to_have_text("32")
                wait_for(lambda: gateway.post("/v2/models/ui-big/infer", json=ids_body([1, 5, 9])).status_code
                         == 200, timeout=90, what="the larger adapter to be served")
            assert only_replica(api, "ui-grows")["pid"] == pid  # its pool grew in the same worker
            held = page.locator('tr[data-adapter="ui-big"] .tiers .tag')
            deadline = time.monotonic() + 30
            while not await held.count() and time.monotonic() < deadline:
                await page.reload()  # the adapters card shows what the replica last reported
            await expect(held.first).to_contain_text("#0")
    finally:
        remove(api, deployments=("ui-grows",), models=("ui-base",))
