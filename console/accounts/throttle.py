"""Sign-in throttling with django-axes: failures are counted per username and address (settings.AXES_*), and a
locked-out pair gets the login page again with why and for how long, as 429."""

from __future__ import annotations

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off
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


def locked_out(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """The login page with the lockout message (settings.AXES_LOCKOUT_CALLABLE)."""
    cool_off = get_cool_off(request)
    minutes = max(1, round(cool_off.total_seconds() / 60)) if cool_off else None
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    context = {"form": form, "locked_out_minutes": minutes, "next": request.POST.get("next", "")}
    return render(request, "registration/login.html", context, status=429)
