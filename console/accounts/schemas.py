from __future__ import annotations

import time
from datetime import datetime
from typing import Literal

from ninja import Field, Schema

from console.accounts import counters
from console.accounts.agents import MAX_HOST_NAME
from console.accounts.expiry import LIFETIME_FORM
from console.accounts.services import MAX_DEPLOYMENTS, MAX_TOKEN_NAME
from console.catalog.schemas import RequestBody

RPM = "requests per minute at the gateway (429 beyond); null: no limit"
TPM = ("tokens (prompt and completion) per minute at the gateway: requests are refused (429) once a minute's "
       "finished requests used this many; null: no limit")


class TokenIn(RequestBody):
    name: str = Field(max_length=MAX_TOKEN_NAME, description="what the token is for, such as the script using it")
    scope: Literal["all", "inference"] = Field("all", description="all: this API and the inference gateway; "
                                               "inference: the gateway only (/v1, /v2)")
    deployments: list[str] = Field(default_factory=list, max_length=MAX_DEPLOYMENTS, description="the deployments "
                                   "it may call on the gateway (scope inference only); empty: all of them")
    expires_in: int | str | None = Field(None, description=f"refuse it after this long: {LIFETIME_FORM}; at least 1 "
                                         "minute, at most 3650 days")
    expires: str | None = Field(None, max_length=40, description="or refuse it from this moment: ISO 8601 with a "
                                "time zone (2027-01-31T18:00:00Z); with neither, it never expires")
    user: str | None = Field(None, max_length=150, description="whose token it is (staff only); default: yours")
    rpm_limit: int | None = Field(None, description=RPM)
    tpm_limit: int | None = Field(None, description=TPM)


class TokenLimitsIn(RequestBody):
    rpm_limit: int | None = Field(None, description=RPM)
    tpm_limit: int | None = Field(None, description=TPM)


class TokenOut(Schema):
    id: int = Field(description="what DELETE /tokens/{id} takes")
    prefix: str = Field(description="the secret's first characters after mg_api_, to recognise it by")
    name: str
    user: str
    scope: str
    deployments: list[str] = Field(description="the deployments it may call; empty: all")
    created: datetime
    last_used: datetime | None = Field(description="to the minute; null: never used")
    expires: datetime | None = Field(description="null: never expires")
    expired: bool
    rpm_limit: int | None = Field(description=RPM)
    tpm_limit: int | None = Field(description=TPM)

    @staticmethod
    def resolve_user(obj) -> str:
        return obj.user.get_username()



class TokenCreatedOut(TokenOut):
    token: str = Field(description="the secret: shown this once, stored only as a hash")


class AgentCredentialIn(RequestBody):
    host_name: str = Field(max_length=MAX_HOST_NAME, description="the name the host's agent reports (agent --name)")


class AgentCredentialOut(Schema):
    host_name: str
    prefix: str = Field(description="the secret's first characters after mg_agent_")
    created: datetime
    last_used: datetime | None = Field(description="its agent's last connection, to the minute")
    connected: bool = Field(description="whether the host's agent is connected now")


class AgentCredentialIssuedOut(Schema):
    host_name: str
    prefix: str
    created: datetime
    rotated: bool = Field(description="it replaced the host's token before, whose links were ended")
    token: str = Field(description="the secret for the agent's --token or MODELGRID_AGENT_TOKEN: shown this once")


class TeamIn(RequestBody):
    name: str = Field(max_length=63, description="letters, digits, '.', '_' and '-', as model names")
    members: list[str] = Field(default_factory=list, max_length=1000, description="user names to put in it")


class MemberIn(RequestBody):
    user: str = Field(max_length=150, description="the user name to add")


class TeamLimitsIn(RequestBody):
    rpm_limit: int | None = Field(None, description=RPM + " (all its deployments together)")
    tpm_limit: int | None = Field(None, description=TPM + " (all its deployments together)")
    token_quota: int | None = Field(None, description="tokens its requests may use per quota period (429 beyond, "
                                    "until the period ends); null: no quota")
    quota_period: str | None = Field(None, description="day, week (from Monday) or month: UTC calendar periods")
    priority_ceiling: str | None = Field(None, description="the highest priority its deployments may have: "
                                         "critical, high, standard or batch")


class TeamOut(Schema):
    name: str
    members: list[str] = Field(description="user names, sorted")
    created: datetime
    rpm_limit: int | None = Field(description=RPM + " (all its deployments together)")
    tpm_limit: int | None = Field(description=TPM + " (all its deployments together)")
    token_quota: int | None = Field(description="tokens per quota period; null: no quota")
    quota_period: str = Field(description="day, week (from Monday) or month, UTC")
    quota_used: int = Field(description="tokens used this quota period, as the consoles last shared them (counted "
                            "with or without a quota)")
    quota_resets: datetime = Field(description="when this quota period ends")
    priority_ceiling: str = Field(description="the highest priority its deployments may have")

    @staticmethod
    def resolve_members(obj) -> list[str]:
        return sorted(u.get_username() for u in obj.members.all())

    @staticmethod
    def resolve_quota_used(obj) -> int:
        return counters.quota_used(obj.pk, obj.quota_period, time.time())

    @staticmethod
    def resolve_quota_resets(obj) -> datetime:
        return counters.quota_resets(obj.quota_period, time.time())
