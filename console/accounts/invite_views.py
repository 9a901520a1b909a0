"""Inviting people from the console: an admin's Invite page of a team (a user name in, a one-time set-password link
out, to copy and pass on), and the page that link opens, where the person sets a password (Django's
PasswordResetConfirmView: the token leaves the address bar before the form shows, the password validators apply).
Members get 403 saying only admins invite; a link that has expired is refused saying when, and every other link that
does not work alike (used, replaced, forged), so that no link tells who has an account."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import INTERNAL_RESET_SESSION_TOKEN, PasswordResetConfirmView
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse_lazy
from django.views.decorators.http import require_http_methods

from console.accounts import invites
from console.accounts.auth import actor_of
from console.accounts.teams import get_team
from console.errors import DomainError, Forbidden, NotFound

PAGE = "accounts/invite.html"


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def invite(request, name: str):
    """An admin's invite form for team `name` (GET), and the link it makes (POST)."""
    try:
        invites.require_inviter(request.user)
        team = get_team(request.user, name)
    except Forbidden as e:  # said without the team's name: a member may not learn which teams exist
        return render(request, PAGE, {"forbidden": str(e)}, status=e.status)
    except NotFound as e:
        raise Http404(str(e)) from None
    context = {"team": team, "user_value": ""}
    if request.method == "POST":
        username = request.POST.get("user", "").strip()
        try:
            made = invites.invite(request.user, team.name, username, actor=actor_of(request))
        except DomainError as e:
            return render(request, PAGE, context | {"error": str(e), "user_value": username}, status=e.status)
        context |= {"invite": made, "link": request.build_absolute_uri(made.path)}
    return render(request, PAGE, context)


class AcceptInvite(PasswordResetConfirmView):
    """The page an invite link opens: set a password, then sign in with it."""

    template_name = "accounts/accept_invite.html"
    success_url = reverse_lazy("login")
    title = "Set your password"

    def _token(self) -> str | None:
        token = self.kwargs.get("token")
        return self.request.session.get(INTERNAL_RESET_SESSION_TOKEN) if token == self.reset_url_token else token

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["invitee"] = self.user.get_username() if self.validlink else ""
        if not self.validlink:
            context["refusal_status"], context["refusal"] = invites.link_refusal(self.user, self._token())
        return context

    def render_to_response(self, context, **kwargs):
        kwargs.setdefault("status", context.get("refusal_status", 200))
        return super().render_to_response(context, **kwargs)

    def form_invalid(self, form):
        return self.render_to_response(self.get_context_data(form=form), status=422)

    def form_valid(self, form):
        response = super().form_valid(form)
        invites.accepted(self.user)
        messages.success(self.request, f"Password set. Sign in as {self.user.get_username()}.")
        return response
