"""A newcomer's path in headless Chromium, on the shared stack: the admin makes a team and invites a person into it;
the person opens the link, sets a password and signs in; they register a model, deploy it twice from the deploy form
with a name, priority and SLO (the priority above their team's ceiling offered disabled), and make a route over the
two deployments on the Routes page, a refused branch said beside its row first. The audit trail names who invited
whom and who accepted. The deployments have no replicas
(nothing to load, so this stays quick). MODELGRID_SCREENSHOTS=DIR writes the docs' screenshots of these pages."""

import os

import pytest
from playwright.async_api import Expect

from tests.e2e.browser import signed_in
from tests.e2e.stack import remove

pytestmark = pytest.mark.browser

TEAM, PERSON, PASSWORD = "newcomers", "nina", "nina-sets-this-1"
expect = Expect()  # this module's own: a form sent or a page loaded may take longer than 5 s on a loaded machine
expect.set_options(timeout=20_000)


async def shot(page, name: str) -> None:
    shots = os.environ.get("MODELGRID_SCREENSHOTS")
    if shots:
        await page.screenshot(path=os.path.join(shots, name), full_page=True)


async def deploy(page, name: str, priority: str, slo: str) -> None:
    """The Models page's Deploy with settings… for nina-llama, filled and sent; lands on the deployment's page."""
    await page.click("nav >> text=Models")
    await page.click('[data-deploy-form="nina-llama"]')
    await expect(page.locator("h1")).to_have_text("Deploy nina-llama")
    form = page.locator("#deploy-form")
    await expect(form.locator('select[name=priority] option[value="critical"]')).to_be_disabled()  # ceiling: high
    await form.locator("input[name=name]").fill(name)
    await form.locator("select[name=priority]").select_option(priority)
    await form.locator("select[name=engine]").select_option("torch")
    await form.locator("input[name=slo_latency_ms]").fill(slo)
    await form.locator("input[name=min_replicas]").fill("0")
    await form.locator("input[name=max_replicas]").fill("0")
    await expect(page.locator("#deploy-estimate .estimate")).to_be_visible()
    if name == "nina-chat":
        await shot(page, "deploy-form.png")
    await form.locator("button[type=submit]").click()
    await expect(page.locator("h1")).to_have_text(name)
    await expect(page.locator(".msg-success")).to_contain_text(
        f"Deployment {name} created (team {TEAM}, priority {priority}, p95 target {slo} ms)")


async def test_a_newcomer_is_invited_signs_in_deploys_and_makes_a_route(stack):
    try:
        async with signed_in(stack.url + "teams/") as admin:
            form = admin.locator("#team-create-form")
            await form.locator("input[name=name]").fill(TEAM)
            await form.locator("button[type=submit]").click()
            await expect(admin.locator(".msg-success")).to_contain_text(f"Team {TEAM} created")
            await admin.click(f'[data-invite="{TEAM}"]')
            await admin.locator("#invite input[name=user]").fill(PERSON)
            await admin.locator("#invite button[type=submit]").click()
            await expect(admin.locator("#invite-link h2")).to_have_text(f"Invite link for {PERSON}")
            link = await admin.locator("#invite-url").input_value()
            await shot(admin, "invite.png")

            # The person, in a browser of their own: the link, a password, then the sign-in page.
            page = await (await admin.context.browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
            page.set_default_timeout(20_000)
            await page.goto(link)
            await expect(page.locator("h1")).to_have_text(f"Welcome, {PERSON}")
            assert "/set-password/" in page.url  # the token left the address bar
            await page.fill("input[name=new_password1]", PASSWORD)
            await page.fill("input[name=new_password2]", PASSWORD)
            await page.click("button[type=submit]")
            await expect(page.locator(".msg-success")).to_contain_text(f"Password set. Sign in as {PERSON}.")
            await page.fill("input[name=username]", PERSON)
            await page.fill("input[name=password]", PASSWORD)
            await page.click("button[type=submit]")
            await expect(page.locator(".topbar .logout span")).to_have_text(PERSON)

            await page.click("nav >> text=Models")
            register = page.locator("#register-form")
            await register.locator("input[name=name]").fill("nina-llama")
            await register.locator("input[name=path]").fill(str(stack.data_dir / "models" / "tiny-llama"))
            await register.locator("button[type=submit]").click()
            await expect(page.locator(".msg-success")).to_contain_text("Registered nina-llama")
            await deploy(page, "nina-chat", "high", "300")
            await deploy(page, "nina-canary", "standard", "800")

            await page.click("nav >> text=Routes")
            card = page.locator("#route-form")
            await card.locator("input[name=name]").fill("nina-assistant")
            rows = card.locator("select[name=target]")
            await rows.nth(0).select_option("nina-chat")
            await rows.nth(1).select_option("nina-chat")
            await card.locator("button[type=submit]").click()  # htmx: the card comes back with the refusal inside
            await expect(card.locator("tr.branch.invalid .field-error")).to_contain_text("nina-chat is named twice")
            await card.locator("button", has_text="Add a branch").click()  # a third row, left empty: left out
            await expect(card.locator("select[name=target]")).to_have_count(3)
            await card.locator("select[name=target]").nth(1).select_option("nina-canary")
            weights = card.locator("input[name=weight]")
            await weights.nth(0).fill("90")
            await weights.nth(1).fill("10")
            await card.locator("button[type=submit]").click()
            row = page.locator('tr[data-route="nina-assistant"]')
            await expect(row.locator('[data-branch="nina-chat"]')).to_contain_text("90%")
            await expect(row.locator('[data-branch="nina-canary"]')).to_contain_text("10%")
            await expect(page.locator(".msg-success")).to_contain_text("Route nina-assistant created")
            await shot(page, "routes.png")

        with stack.admin_api() as api:
            dep = api.get("/deployments/nina-chat").json()
            assert (dep["team"], dep["priority"], dep["slo_latency_ms"], dep["engine"]) == (TEAM, "high", 300, "torch")
            route = api.get("/routes/nina-assistant").json()
            assert route["team"] == TEAM and [(b["deployment"], b["weight"]) for b in route["branches"]] == [
                ("nina-chat", 90), ("nina-canary", 10)]
            audit = api.get("/audit", params={"kind": "team"}).json()
            reasons = {(e["reason"], e["actor"]) for e in audit}
            assert ("Invited", "user admin") in reasons and ("InviteAccepted", f"user {PERSON}") in reasons
    finally:
        with stack.admin_api() as api:
            api.delete("/routes/nina-assistant")
            remove(api, deployments=("nina-chat", "nina-canary"), models=("nina-llama",))
