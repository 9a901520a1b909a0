"""A person's path through the console in headless Chromium: sign in, register a model from the
store with one click, deploy it with one more, and watch the GPU grid change live."""

import os

import pytest
import websockets
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


async def test_the_policy_form_changes_priority_and_slo_in_place(stack):
    """A deployment with no replicas (nothing to load, so this stays quick): change its policy through the
    card, see the outcome in it without a page load, the status follow, a refusal name the field, and the
    stored values after a reload."""
    with stack.api() as api:
        path = str(stack.data_dir / "models" / "tiny-llama")
        model = api.post("/models", json={"name": "policy-model", "path": path})
        assert model.status_code in (201, 409), model.text
        created = api.post("/deployments", json={"name": "policy-demo", "model": "policy-model", "replicas": 0})
        assert created.status_code == 201, created.text
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        try:
            await page.goto(stack.url + "deployments/policy-demo/")
            await page.fill("input[name=username]", "admin")
            await page.fill("input[name=password]", ADMIN_PASSWORD)
            await page.click("button[type=submit]")
            await expect(page.locator("h1")).to_have_text("policy-demo")
            await page.evaluate("window.__noReload = true")
            card = page.locator("#policy")
            await card.locator("select[name=priority]").select_option("critical")
            await card.locator("input[name=slo_latency_ms]").fill("150")
            await card.locator("button[type=submit]").click()
            await expect(card.locator(".msg-success")).to_contain_text("priority standard → critical")
            await expect(card.locator(".msg-success")).to_contain_text("p95 target none → 150 ms")
            status = page.locator("#deployment-status")
            await expect(status.locator('[data-stat="priority"] .tag')).to_have_text("critical")
            await expect(status.locator('[data-stat="latency"] .badge')).to_have_text("no traffic yet")
            assert await page.evaluate("window.__noReload === true"), "the form reloaded the page"

            await card.locator("input[name=min_replicas]").fill("3")
            await card.locator("input[name=max_replicas]").fill("1")
            await card.locator("button[type=submit]").click()
            await expect(card.locator(".msg-error")).to_have_text(
                "Not saved: max_replicas 1 is below min_replicas 3. Nothing was changed.")
            await expect(card.locator("input[name=max_replicas]")).to_have_attribute("aria-invalid", "true")

            with stack.api() as api:  # a change from elsewhere reaches the page through its 2 s poll
                assert api.patch("/deployments/policy-demo", json={"priority": "high"}).status_code == 200
            await expect(status.locator('[data-stat="priority"] .tag')).to_have_text("high", timeout=10_000)

            await page.reload()
            await expect(page.locator("#policy select[name=priority]")).to_have_value("high")
            await expect(page.locator("#policy input[name=slo_latency_ms]")).to_have_value("150")
            await expect(page.locator("#policy input[name=min_replicas]")).to_have_value("0")
        finally:
            await browser.close()
            with stack.api() as api:
                api.delete("/deployments/policy-demo")
                api.delete("/models/policy-model")


@pytest.mark.parametrize("width", [1280, 760])
async def test_gpu_names_on_the_grid_are_never_cut_short(stack, width):
    """The grid once showed a simulated GPU's name as "S…": the memory figures took its room."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = await browser.new_page(viewport={"width": width, "height": 900})
        page.set_default_timeout(20_000)
        try:
            await sign_in(page, stack.url)
            await expect(page.locator(".gpu-name")).to_have_count(2)
            names = await page.eval_on_selector_all(".gpu-name", "els => els.map(e => [e.textContent, e.title, "
                                                    "e.scrollWidth <= e.clientWidth, e.getBoundingClientRect().width])")
            for text, title, whole, shown in names:
                assert (text, title, whole) == ("24 GiB", "Simulated GPU 24 GiB", True)
                assert shown > 20  # laid out at its own width, not squeezed
        finally:
            await browser.close()


async def sign_in(page, url: str) -> None:
    await page.goto(url)
    for field, value in (("username", "admin"), ("password", ADMIN_PASSWORD)):
        await page.fill(f"input[name={field}]", value)
    await page.click("button[type=submit]")


async def test_a_dashboard_past_the_per_user_cap_says_why_it_is_not_live(stack):
    """The admin's 20 live pages (one tab here, 19 sockets of a script with its cookie) are the cap per user: a
    21st tab is closed with 4429, and its dot says why instead of retrying."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        context = await browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(20_000)
        extra = []
        try:
            await page.goto(stack.url)
            await page.fill("input[name=username]", "admin")
            await page.fill("input[name=password]", ADMIN_PASSWORD)
            await page.click("button[type=submit]")
            await expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
            session = next(c["value"] for c in await context.cookies() if c["name"] == "sessionid")
            for _ in range(19):
                extra.append(await websockets.connect(stack.url.replace("http", "ws", 1) + "ws/dashboard/",
                                                      origin=stack.url.rstrip("/"),
                                                      additional_headers={"Cookie": f"sessionid={session}"}))
            late = await context.new_page()
            await late.goto(stack.url)
            dot = late.locator("#live-indicator")
            await expect(dot).to_have_attribute("data-state", "closed")
            await expect(dot).to_contain_text("You have 20 live pages open, the limit per user.")
        finally:
            for ws in extra:
                await ws.close()
            await browser.close()
