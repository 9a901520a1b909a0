"""A person makes an API token with an expiry on the Tokens page in headless Chromium, a script uses it against the
REST API and the gateway, and once the person revokes it (after confirming) the API refuses it, saying so."""

import httpx
import pytest
from playwright.async_api import expect

from tests.e2e.browser import signed_in

pytestmark = pytest.mark.browser


async def test_a_token_is_created_with_an_expiry_used_and_revoked(stack):
    async with signed_in(stack.url) as page:
        await page.click("nav >> text=Tokens")
        await expect(page.locator("h1")).to_have_text("Tokens")

        form = page.locator("#token-form")
        await form.locator("input[name=name]").fill("browser-ci")
        await form.locator("select[name=scope]").select_option("all")
        await form.locator("input[name=expires_in]").fill("2h")
        await form.locator("button[type=submit]").click()
        secret = (await page.locator("#new-secret").inner_text()).strip()
        assert secret.startswith("mg_api_")
        row = page.locator("tr[data-token]", has_text="browser-ci")
        await expect(row).to_have_count(1)
        await expect(row.locator("[data-expires]")).not_to_have_text("never")

        api = httpx.Client(base_url=stack.url + "api/v1", headers={"Authorization": f"Bearer {secret}"},
                           timeout=30)
        assert api.get("/deployments").status_code == 200
        with stack.gateway(secret) as gateway:
            assert gateway.get("/v1/models").status_code == 200

        asked = []

        async def confirm(dialog):
            asked.append(dialog.message)
            await dialog.accept()

        page.once("dialog", confirm)
        await row.locator("button", has_text="Revoke").click()
        await expect(page.locator(".msg-success")).to_contain_text("Token browser-ci revoked")
        assert asked and "browser-ci" in asked[0]
        await expect(page.locator("tr[data-token]", has_text="browser-ci")).to_have_count(0)

        refused = api.get("/deployments")
        assert refused.status_code == 401
        assert refused.json()["detail"][0]["msg"].startswith("token revoked at ")
        api.close()
