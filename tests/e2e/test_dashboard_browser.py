"""A person's path through the console in headless Chromium: sign in, register a model from the
store with one click, deploy it with one more, and watch the GPU grid change live."""

import os

import pytest
from playwright.async_api import async_playwright, expect

from tests.e2e.stack import ADMIN_PASSWORD

CHROMIUM = os.environ.get("MODELGRID_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]

pytestmark = pytest.mark.browser


async def test_the_dashboard_follows_a_deployment_live(stack, tmp_path):
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        try:
            await page.goto(stack.url)
            await page.fill("input[name=username]", "admin")
            await page.fill("input[name=password]", ADMIN_PASSWORD)
            await page.click("button[type=submit]")
            await expect(page.locator("h1")).to_have_text("GPU fleet")
            await expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
            await expect(page.locator(".host h2")).to_have_text("local")
            await expect(page.locator(".gpu")).to_have_count(2)
            await expect(page.locator(".gpu .pill.sim").first).to_have_text("simulated")

            await page.click("nav >> text=Models")
            row = page.locator('[data-store-entry="tiny-llama"]')
            await row.locator("button", has_text="Register").click()
            await expect(page.locator(".msg-success")).to_contain_text("Registered tiny-llama")
            await page.locator('[data-model="tiny-llama"] button', has_text="Deploy").click()
            await expect(page.locator("h1")).to_contain_text("tiny-llama")

            await page.click("nav >> text=Dashboard")
            await page.evaluate("window.__noReload = true")
            segment = page.locator('.seg[data-deployment="tiny-llama"]')
            await expect(segment).to_have_count(1)
            await expect(segment).to_have_class("seg state-ready", timeout=120_000)
            await expect(page.locator('tr[data-deployment="tiny-llama"] .pill')).to_have_text("ready")
            await page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

            with stack.api() as api:
                assert api.delete("/deployments/tiny-llama").status_code == 204
            await expect(segment).to_have_count(0, timeout=30_000)
            assert await page.evaluate("window.__noReload === true"), "the page reloaded instead of updating live"
        finally:
            await browser.close()
