"""Sign-in throttling with django-axes: failures are counted per username and the address that connected
(settings.AXES_*), a failure leaves a bounded record, and a locked-out pair gets the login page again with why and
for how long, as 429."""

from __future__ import annotations

from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off, get_query_str
from axes.models import AccessAttempt
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class ThrottledSignIn(AxesStandaloneBackend):
    """Refuses a locked-out username and address before any password is checked.

    Every sign-in that comes from the network (the login page, the admin's) passes its request; a call
    without one (the test client's `login()`, a shell) is no network attempt, so it is neither counted nor
    refused here instead of failing as django-axes would."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


# Of each failed attempt's query, form and Accept header, the first this many characters are kept (passwords and
# usernames masked, as django-axes does).
STORED_CHARS = 256


class BoundedRecords(AxesDatabaseHandler):
    """django-axes' database handler (settings.AXES_HANDLER), with what a failed sign-in leaves bounded.

    Its handler appends each failure's query and form (up to 2 KiB) to the row that counts the failures of one
    username, address and user agent, so an unauthenticated client could grow one row without end; here the row
    keeps an excerpt of the latest attempt only. Counting, lockouts and resets are django-axes' own."""

    def user_login_failed(self, sender, credentials: dict, request: HttpRequest | None = None, **kwargs) -> None:
        super().user_login_failed(sender, credentials, request=request, **kwargs)
        if request is None or not hasattr(request, "axes_ip_address"):
            return
        AccessAttempt.objects.filter(
            username=get_client_username(request, credentials), ip_address=request.axes_ip_address,
            user_agent=request.axes_user_agent,
        ).update(get_data=get_query_str(request.GET, STORED_CHARS).replace("\0", ""),
                 post_data=get_query_str(request.POST, STORED_CHARS).replace("\0", ""),
                 http_accept=request.axes_http_accept[:STORED_CHARS])


def client_address(request: HttpRequest) -> str | None:
    """The address a sign-in is counted under (settings.AXES_CLIENT_IP_CALLABLE): the peer as the server passed it,
    which takes X-Forwarded-For only from the proxies named in FORWARDED_ALLOW_IPS. Headers are never read here: a
    client writes whatever it likes in them."""
    return request.META.get("REMOTE_ADDR")


def locked_out(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """The login page with the lockout message (settings.AXES_LOCKOUT_CALLABLE)."""
    cool_off = get_cool_off(request)
    minutes = max(1, round(cool_off.total_seconds() / 60)) if cool_off else None
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    context = {"form": form, "locked_out_minutes": minutes, "next": request.POST.get("next", "")}
    return render(request, "registration/login.html", context, status=429)
