"""Headless Chromium (Debian's) signed in to a stack as its admin: what every browser test starts from."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from playwright.async_api import Page, async_playwright

from tests.e2e.stack import ADMIN_PASSWORD

CHROMIUM = os.environ.get("MODELGRID_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]


@asynccontextmanager
async def signed_in(url: str, height: int = 900) -> AsyncIterator[Page]:
    """A page at `url` after the admin signed in on the login page it redirects to; the browser closes after."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": height})
            page.set_default_timeout(20_000)
            await page.goto(url)
            await page.fill("input[name=username]", "admin")
            await page.fill("input[name=password]", ADMIN_PASSWORD)
            await page.click("button[type=submit]")
            yield page
        finally:
            await browser.close()
