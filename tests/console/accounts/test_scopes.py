"""Token scopes: an inference-only token is refused by the REST API with 403 and a reason (a missing or
unknown token stays 401), and createapitoken --scope makes one. What the gateway reads of a token:
tests/console/gateway/test_token_limits.py."""

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from console.accounts.models import ApiToken, Scope
from console.deployments.models import Deployment
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
INFERENCE_ONLY = ("this token may only call the inference gateway (scope inference); "
                  "use a token with scope all for the REST API")


@pytest.fixture
def ops():
    return get_user_model().objects.create_user("ops")


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_an_inference_token_is_refused_by_the_rest_api_with_403_and_the_reason(client, ops):
    _, token = ApiToken.issue(ops, "chatbot", scope=Scope.INFERENCE)
    r = client.get("/api/v1/deployments", **bearer(token))
    assert r.status_code == 403
    assert r.json() == {"detail": [{"loc": [], "msg": INFERENCE_ONLY, "type": "forbidden"}]}


def test_an_inference_token_cannot_change_anything_either(client, ops, model_dir):
    _, token = ApiToken.issue(ops, scope=Scope.INFERENCE)
    r = client.post("/api/v1/models", data=json.dumps({"name": "tiny", "path": str(model_dir)}),
                    content_type="application/json", **bearer(token))
    assert r.status_code == 403 and refusal(r) == INFERENCE_ONLY
    r = client.post("/api/v1/deployments", data=json.dumps({"name": "chat", "model": "tiny"}),
                    content_type="application/json", **bearer(token))
    assert r.status_code == 403 and not Deployment.objects.exists()


def test_a_token_with_scope_all_calls_the_rest_api(client, ops):
    _, token = ApiToken.issue(ops, scope=Scope.ALL)
    assert client.get("/api/v1/deployments", **bearer(token)).status_code == 200


def test_a_missing_or_unknown_token_is_still_401(client, ops):
    _, token = ApiToken.issue(ops, scope=Scope.INFERENCE)
    assert client.get("/api/v1/deployments").status_code == 401
    r = client.get("/api/v1/deployments", **bearer(token[:-1] + ("x" if token[-1] != "x" else "y")))
    assert r.status_code == 401 and INFERENCE_ONLY not in r.content.decode()


def test_a_signed_in_browser_still_calls_the_api_with_its_session(user_client):
    assert user_client.get("/api/v1/deployments").status_code == 200


def test_a_script_sending_an_inference_token_is_refused_even_beside_a_session(user_client, ops):
    # The token says what the caller meant; a session cookie alongside it does not widen it.
    _, token = ApiToken.issue(ops, scope=Scope.INFERENCE)
    assert user_client.get("/api/v1/deployments", **bearer(token)).status_code == 403


def test_createapitoken_makes_an_inference_only_token_when_asked(client):
    out, err = StringIO(), StringIO()
    call_command("createapitoken", "chatbot", "--scope", "inference", stdout=out, stderr=err)
    token = out.getvalue().strip()
    assert ApiToken.authenticate(token).scope == "inference"
    assert "may only call the inference gateway" in err.getvalue()
    assert client.get("/api/v1/hosts", **bearer(token)).status_code == 403


def test_createapitoken_makes_a_full_token_by_default():
    out = StringIO()
    call_command("createapitoken", "robot", stdout=out, stderr=StringIO())
    assert ApiToken.authenticate(out.getvalue().strip()).scope == "all"


def test_createapitoken_refuses_an_unknown_scope_naming_the_choices_and_creates_nobody():
    with pytest.raises(CommandError) as e:
        call_command("createapitoken", "robot", "--scope", "admin", stdout=StringIO(), stderr=StringIO())
    assert "unknown scope 'admin'" in str(e.value)
    assert "all (REST API and inference)" in str(e.value) and "inference (inference only)" in str(e.value)
    assert not get_user_model().objects.filter(username="robot").exists()
    assert not ApiToken.objects.exists()
