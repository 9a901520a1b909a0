from django.http import HttpResponse
from ninja import Query, Router, Status

from console.accounts import agents, limits, services, teams
from console.accounts.auth import actor_of
from console.accounts.schemas import (
    AgentCredentialIn,
    AgentCredentialIssuedOut,
    AgentCredentialOut,
    MemberIn,
    TeamIn,
    TeamLimitsIn,
    TeamOut,
    TokenCreatedOut,
    TokenIn,
    TokenLimitsIn,
    TokenOut,
)
from console.catalog.schemas import ErrorOut
from console.pagination import ListQuery, name_search, paginate, set_page_headers

router = Router()
agent_router = Router()
team_router = Router()


@router.get("", response={200: list[TokenOut], 422: ErrorOut},
            summary="API tokens, never their secrets: yours, or everyone's for staff; newest first, a page at a time "
            "(X-Total-Count and Link headers; filter with q)")
def list_tokens(request, response: HttpResponse, query: Query[ListQuery]):
    page, window = paginate(name_search(services.visible_tokens(request.user), query.q), query.page, query.per_page)
    set_page_headers(response, request, page)
    return list(window)


@router.post("", response={201: TokenCreatedOut, 403: ErrorOut, 422: ErrorOut},
             summary="Make an API token, with an expiry and a scope (per deployment too); its secret is answered "
             "this once")
def create_token(request, body: TokenIn):
    row, secret = services.create_token(request.user, services.TokenRequest(**body.dict()),
                                        via=getattr(request, "api_token", None), actor=actor_of(request))
    row.token = secret  # answered this once, never stored
    return Status(201, row)


@router.patch("/{token_id}", response={200: TokenOut, 404: ErrorOut, 422: ErrorOut},
              summary="Change a token's requests and tokens per minute (its owner or staff; null: no limit); the "
              "gateway applies it within 10 s")
def change_token(request, token_id: int, body: TokenLimitsIn):
    return limits.set_token_limits(request.user, token_id, body.dict(exclude_unset=True), actor=actor_of(request))


@router.delete("/{token_id}", response={204: None, 404: ErrorOut},
               summary="Revoke a token: from now on it is refused with 401 saying when it was revoked (the gateway "
               "within 10 s)")
def revoke_token(request, token_id: int):
    services.revoke_token(request.user, token_id, actor=actor_of(request))
    return Status(204, None)


@agent_router.get("", response={200: list[AgentCredentialOut], 403: ErrorOut, 422: ErrorOut},
                  summary="The agents' tokens by host name, never their secrets (staff only; X-Total-Count and Link "
                  "headers; filter with q)")
def list_agent_credentials(request, response: HttpResponse, query: Query[ListQuery]):
    page, window = paginate(agents.credentials(request.user, query.q), query.page, query.per_page)
    set_page_headers(response, request, page)
    return agents.shown(window)


@agent_router.post("", response={201: AgentCredentialIssuedOut, 403: ErrorOut, 422: ErrorOut},
                   summary="Issue a host's agent token, or rotate it (ending the links made with the old one); the "
                   "secret is answered this once (staff only)")
def issue_agent_credential(request, body: AgentCredentialIn):
    row, secret, rotated = agents.issue(request.user, body.host_name, actor=actor_of(request))
    return Status(201, {"host_name": row.host_name, "prefix": row.prefix, "created": row.created, "rotated": rotated,
                        "token": secret})


@agent_router.delete("/{host_name}", response={204: None, 403: ErrorOut, 404: ErrorOut},
                     summary="Revoke a host's agent token: its agent's links end and it is refused until given a new "
                     "one (staff only)")
def revoke_agent_credential(request, host_name: str):
    agents.revoke(request.user, host_name, actor=actor_of(request))
    return Status(204, None)


@team_router.get("", response={200: list[TeamOut], 422: ErrorOut},
                 summary="Teams and their members: yours, or every team for admins (X-Total-Count and Link headers; "
                 "filter with q)")
def list_teams(request, response: HttpResponse, query: Query[ListQuery]):
    page, window = paginate(name_search(teams.visible_teams(request.user), query.q), query.page, query.per_page)
    set_page_headers(response, request, page)
    return list(window)


@team_router.post("", response={201: TeamOut, 403: ErrorOut, 409: ErrorOut, 422: ErrorOut},
                  summary="Create a team, with members (admins only)")
def create_team(request, body: TeamIn):
    return Status(201, teams.create_team(request.user, body.name, body.members, actor=actor_of(request)))


@team_router.get("/{name}", response={200: TeamOut, 404: ErrorOut}, summary="A team and its members")
def get_team(request, name: str):
    return teams.get_team(request.user, name)


@team_router.patch("/{name}", response={200: TeamOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut},
                   summary="Change a team's requests and tokens per minute, token quota and period, and priority "
                   "ceiling (admins only; null: no limit); the gateways apply it within a second")
def change_team(request, name: str, body: TeamLimitsIn):
    return limits.set_team_limits(request.user, name, body.dict(exclude_unset=True), actor=actor_of(request))


@team_router.post("/{name}/members", response={200: TeamOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut},
                  summary="Add a user to a team (admins only); their tokens reach its objects (the gateway within "
                  "10 s)")
def add_member(request, name: str, body: MemberIn):
    return teams.add_member(request.user, name, body.user, actor=actor_of(request))


@team_router.delete("/{name}/members/{user}", response={200: TeamOut, 403: ErrorOut, 404: ErrorOut},
                    summary="Take a user out of a team (admins only); their tokens stop reaching its objects (the "
                    "gateway within 10 s)")
def remove_member(request, name: str, user: str):
    return teams.remove_member(request.user, name, user, actor=actor_of(request))
