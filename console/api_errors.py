"""Every error under /api is the REST API's JSON (`{"detail": [{"loc", "msg", "type"}]}`, as console/api.py
answers its own refusals), also where Django or django-ninja would answer an HTML or plain-text page: a path
the API does not have (404), a method a path does not take (405), a failure outside the API's views (500)."""

from __future__ import annotations

from http import HTTPStatus

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware

KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After")


@sync_and_async_middleware
def api_json_errors(get_response):
    """Django middleware (first in MIDDLEWARE, so it sees every answer): non-JSON errors under /api as JSON."""
    if iscoroutinefunction(get_response):
        async def middleware(request: HttpRequest) -> HttpResponse:
            return as_json(request, await get_response(request))
    else:
        def middleware(request: HttpRequest) -> HttpResponse:
            return as_json(request, get_response(request))
    return middleware


def is_api(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def as_json(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """`response` itself unless it is an error under /api that is not JSON; then the API's shape, same status."""
    if response.status_code < 400 or not is_api(request.path) or response.get("Content-Type", "").startswith(
            "application/json"):
        return response
    status, method, path = response.status_code, request.method, request.path
    if status == 404:
        msg, kind = (f"the API has no path {method} {path}; its paths are listed at /api/v1/docs "
                     "(the OpenAPI schema: /api/v1/openapi.json)"), "not_found"
    elif status == 405:
        allowed = response.get("Allow", "")
        msg, kind = f"{method} is not allowed on {path}; it takes {allowed or 'other methods'}", "method_not_allowed"
    elif status >= 500:  # Django logged the traceback (django.request)
        msg, kind = "internal error: the console logged it", "server_error"
    else:
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else f"HTTP {status}"
        msg, kind = f"{phrase}: {method} {path}", phrase.lower().replace(" ", "_")
    answer = JsonResponse({"detail": [{"loc": [], "msg": msg, "type": kind}]}, status=status)
    for header in KEPT_HEADERS:
        if header in response:
            answer[header] = response[header]
    return answer
