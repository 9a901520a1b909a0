"""Who changed what, in headless Chromium: a person makes a token on the Tokens page, finds the change on the Audit
page (named as themselves), narrows the page by kind, and a filter that is no time is said on the page."""

import pytest
from playwright.async_api import expect

from tests.e2e.browser import signed_in

pytestmark = pytest.mark.browser


async def test_a_change_is_on_the_audit_page_with_who_made_it_and_the_filters_narrow_it(stack):
    async with signed_in(stack.url) as page:
        await page.click("nav >> text=Tokens")
        form = page.locator("#token-form")
        await form.locator("input[name=name]").fill("audit-ci")
        await form.locator("button[type=submit]").click()
        await expect(page.locator("#new-secret")).to_be_visible()

        await page.click("nav >> text=Audit")
        await expect(page.locator("h1")).to_have_text("Audit")
        row = page.locator('tr[data-object="token/admin/audit-ci"]')
        await expect(row).to_have_count(1)
        await expect(row.locator(".actor")).to_have_text("user admin")
        await expect(page.locator("tr[data-reason=Placed]")).to_have_count(0)  # the scheduler's are not changes

        await page.locator("select[name=kind]").select_option("route")  # submits on change
        await expect(page.locator("[data-no-events]")).to_be_visible()
        await page.locator("select[name=kind]").select_option("token")
        await expect(page.locator('tr[data-object="token/admin/audit-ci"]')).to_have_count(1)

        await page.locator("input[name=since]").fill("yesterday")
        await page.locator("form[role=search] button[type=submit]").click()
        await expect(page.locator(".msg-error")).to_contain_text("since: 'yesterday' is neither unix seconds")
