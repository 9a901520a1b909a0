from django.http import HttpResponse
from ninja import Query, Router, Status

from console.accounts import agents, services
from console.accounts.auth import actor_of
from console.accounts.schemas import (
    AgentCredentialIn,
    AgentCredentialIssuedOut,
    AgentCredentialOut,
    TokenCreatedOut,
    TokenIn,
    TokenOut,
)
from console.catalog.schemas import ErrorOut
from console.pagination import ListQuery, name_search, paginate, set_page_headers

router = Router()
agent_router = Router()


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
