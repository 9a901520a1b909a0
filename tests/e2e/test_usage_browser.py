"""Usage accounting end to end: real requests through a real `manage.py up` to the tiny Llama (completions, chat,
streams with and without the usage chunk asked for), their `usage` as the client got it summed, and the same figures
from the usage API and on the usage page in headless Chromium."""

import time

import pytest
from playwright.async_api import expect

from tests.e2e.browser import signed_in
from tests.e2e.stack import remove, wait_for

pytestmark = pytest.mark.browser
NAME = "usage-chat"


def _ready(api) -> bool:
    return any(r["state"] == "ready" for r in api.get(f"/deployments/{NAME}").json().get("replicas", []))


async def test_the_usage_page_shows_what_the_engine_counted(stack):
    import openai

    with stack.api() as api:
        path = str(stack.data_dir / "models" / "tiny-llama")
        assert api.post("/models", json={"name": "usage-llama", "path": path}).status_code in (201, 409)
        assert api.post("/deployments", json={"name": NAME, "model": "usage-llama"}).status_code == 201
        wait_for(lambda: _ready(api), timeout=120, what=f"{NAME} to be ready")
    try:
        client = openai.OpenAI(base_url=stack.url + "v1", api_key=stack.token, max_retries=0)
        greedy = {"max_tokens": 6, "temperature": 0}
        messages = [{"role": "user", "content": "hi there"}]
        seen = []  # (prompt, completion) of each request, as its client got it
        done = client.completions.create(model=NAME, prompt="the cat", **greedy)
        seen.append((done.usage.prompt_tokens, done.usage.completion_tokens))
        chat = client.chat.completions.create(model=NAME, messages=messages, **greedy)
        seen.append((chat.usage.prompt_tokens, chat.usage.completion_tokens))
        asked = list(client.chat.completions.create(model=NAME, messages=messages, stream=True,
                                                    stream_options={"include_usage": True}, **greedy))
        assert asked[-1].choices == [] and asked[-1].usage == chat.usage
        seen.append((asked[-1].usage.prompt_tokens, asked[-1].usage.completion_tokens))
        # Not asked for: the client gets no usage chunk; the gateway counts it all the same (greedy: as `done`).
        plain = list(client.completions.create(model=NAME, prompt="the cat", stream=True, **greedy))
        assert all(c.choices and c.usage is None for c in plain)
        assert "".join(c.choices[0].text for c in plain) == done.choices[0].text
        seen.append(seen[0])
        prompt, completion = sum(p for p, _ in seen), sum(c for _, c in seen)

        since = int(time.time()) - 3600
        with stack.api() as api:
            def totals():
                body = api.get(f"/usage?group=deployment&deployment={NAME}&since={since}").json()
                return body["totals"] if body["totals"]["requests"] == len(seen) else None

            got = wait_for(totals, timeout=30, what="the usage to be written")
        assert (got["prompt_tokens"], got["completion_tokens"], got["errors"]) == (prompt, completion, 0)

        # Its model's page: the stack's other tests' traffic (the same token, other models) is not on it.
        async with signed_in(stack.url + f"usage/?by=deployment&range=1h&model={NAME}") as page:
            await expect(page.locator("h1")).to_have_text("Usage")
            row = page.locator(f'table.usage-table tr[data-key="{NAME}"]')
            await expect(row.locator('[data-col="requests"]')).to_have_text(str(len(seen)))
            await expect(row.locator('[data-col="prompt_tokens"]')).to_have_text(f"{prompt:,}")
            await expect(row.locator('[data-col="completion_tokens"]')).to_have_text(f"{completion:,}")
            await expect(page.locator('[data-chart="usage-deployment"] .chart-legend')).to_contain_text(NAME)
            for total, value in (("requests", len(seen)), ("prompt_tokens", prompt), ("completion_tokens", completion)):
                await expect(page.locator(f'[data-total="{total}"] .stat-value')).to_have_text(f"{value:,}")
            await page.screenshot(path=str(stack.data_dir / "usage-page.png"), full_page=True)
    finally:
        with stack.api() as api:
            remove(api, deployments=(NAME,), models=("usage-llama",))
