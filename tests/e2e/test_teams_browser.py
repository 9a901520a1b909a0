"""Teams in headless Chromium: the admin makes a team on the Teams page, sees a refused limit said beside its field,
sets the team's requests per minute, and a member's token calling the team's deployment through the gateway is then
refused with 429 naming the team's limit. The deployment stands by with no replica: admission comes before waiting
for a replica, so nothing is loaded (the admitted request gets an immediate 503)."""

import pytest
from playwright.async_api import expect

from tests.e2e.browser import signed_in
from tests.e2e.stack import remove, wait_for

pytestmark = pytest.mark.browser

TEAM = "rpm-team"
INFER = {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 5, 9]}]}


def _refused_by_the_team(gateway, statuses: list[int]):
    r = gateway.post("/v2/models/rpm-chat/infer", json=INFER)
    statuses.append(r.status_code)
    # 404 while the token's cached lookup (10 s) predates its user joining the team; 503 while admitted (standby)
    return r if r.status_code == 429 else None


async def test_an_admin_sets_a_teams_rpm_and_its_token_is_refused(stack):
    try:
        async with signed_in(stack.url) as page:
            await page.click("nav >> text=Teams")
            await expect(page.locator("h1")).to_have_text("Teams")
            form = page.locator("#team-create-form")
            await form.locator("input[name=name]").fill(TEAM)
            await form.locator("input[name=members]").fill("e2e")  # the stack's token's user
            await form.locator("button[type=submit]").click()
            await expect(page.locator(".msg-success")).to_contain_text(f"Team {TEAM} created")
            card = page.locator(f'section[data-team="{TEAM}"]')
            await expect(card.locator('[data-member="e2e"]')).to_have_count(1)

            limits = card.locator('form[data-form="limits"]')
            await limits.locator("input[name=rpm_limit]").fill("0")
            await limits.locator("button[type=submit]").click()
            card = page.locator(f'section[data-team="{TEAM}"]')
            await expect(card.locator("label.invalid .field-error")).to_contain_text("rpm_limit must be a whole number")
            await expect(card.locator('[data-limit="rpm_limit"]')).to_have_text("no limit")

            limits = card.locator('form[data-form="limits"]')
            await limits.locator("input[name=rpm_limit]").fill("1")
            await limits.locator("button[type=submit]").click()
            await expect(page.locator(".msg-success")).to_contain_text(f"Saved team {TEAM}'s limits")
            await expect(page.locator(f'section[data-team="{TEAM}"] [data-limit="rpm_limit"]')).to_have_text("1")

        with stack.api() as api:
            path = str(stack.data_dir / "models" / "tiny-llama")
            made = api.post("/models", json={"name": "rpm-model", "path": path, "team": TEAM})
            assert made.status_code == 201, made.text
            made = api.post("/deployments", json={"name": "rpm-chat", "model": "rpm-model", "min_replicas": 0,
                                                  "max_replicas": 1, "standby": True})
            assert made.status_code == 201, made.text
            assert made.json()["team"] == TEAM
        statuses: list[int] = []
        with stack.gateway() as gateway:
            refusal = wait_for(lambda: _refused_by_the_team(gateway, statuses), 30, interval=0.2,
                               what="the team's rpm_limit to refuse its token")
        error = refusal.json()["error"]
        assert f"rate limit: team '{TEAM}' may make 1 requests per minute (its rpm_limit)" in error, error
        assert 1 <= int(refusal.headers["retry-after"]) <= 60
        assert set(statuses) <= {404, 503, 429}, statuses  # never served: no replica was loaded for it
    finally:
        # The stack's user back in its one team: other tests make models without naming one.
        with stack.admin_api() as api:
            remove(api, deployments=("rpm-chat",), models=("rpm-model",))
            api.delete(f"/teams/{TEAM}/members/e2e")
