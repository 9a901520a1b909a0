"""Routes against a real `manage.py up`, through the official `openai` client: a public model name answers from its
branch, says which in x-modelgrid-route, moves to another branch when the route changes (no restart), and falls back
when its branch is refused."""

from __future__ import annotations

from tests.e2e.stack import remove, wait_for


def _served(client, model: str) -> tuple[str, str]:
    """The route header and the completion's text of one greedy request to `model`."""
    raw = client.completions.with_raw_response.create(model=model, prompt="the cat", max_tokens=4, temperature=0)
    return raw.headers.get("x-modelgrid-route", ""), raw.parse().choices[0].text


def test_a_route_serves_moves_and_falls_back_through_the_openai_client(stack, tiny_llama):
    import openai

    api = stack.api()
    try:
        assert api.post("/models", json={"name": "rt-llama", "path": str(tiny_llama)}).status_code == 201
        for name in ("rt-stable", "rt-canary"):
            assert api.post("/deployments", json={"name": name, "model": "rt-llama"}).status_code == 201
        r = api.post("/routes", json={"name": "rt-assistant", "branches": [{"deployment": "rt-stable"}],
                                      "fallback": "rt-stable"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "fallback"]
        r = api.post("/routes", json={"name": "rt-assistant", "branches": [{"deployment": "rt-stable"}]})
        assert r.status_code == 201, r.text
        for name in ("rt-stable", "rt-canary"):
            wait_for(lambda name=name: any(x["state"] == "ready" for x in api.get(f"/deployments/{name}").json()
                                           ["replicas"]), timeout=180, what=f"{name} to be ready")

        client = openai.OpenAI(base_url=stack.url + "v1", api_key=stack.token, max_retries=0)
        assert "rt-assistant" in {m.id for m in client.models.list()}
        header, text = _served(client, "rt-assistant")
        assert header == "rt-assistant -> rt-stable"
        # The same model's greedy answer, as from the deployment named directly.
        assert text == client.completions.create(model="rt-stable", prompt="the cat", max_tokens=4,
                                                 temperature=0).choices[0].text

        r = api.patch("/routes/rt-assistant", json={"branches": [{"deployment": "rt-canary"}], "fallback": "rt-stable"})
        assert r.status_code == 200, r.text
        wait_for(lambda: _served(client, "rt-assistant")[0] == "rt-assistant -> rt-canary", timeout=10,
                 what="the changed route to send traffic to rt-canary")

        # The canary stands by (loaded, taking no requests): refused with 503, so the fallback answers.
        assert api.patch("/deployments/rt-canary", json={"standby": True}).status_code == 200
        fell_back = "rt-assistant -> rt-stable (fallback: rt-canary answered 503)"
        assert wait_for(lambda: _served(client, "rt-assistant")[0] == fell_back, timeout=10,
                        what="the fallback to answer for the standing-by canary")
        events = api.get("/events?object=route/rt-assistant").json()["events"]
        assert {"Created", "Changed"} <= {e["reason"] for e in events}
    finally:
        api.delete("/routes/rt-assistant")
        remove(api, deployments=("rt-stable", "rt-canary"), models=("rt-llama",))
