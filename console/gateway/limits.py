"""Requests and tokens per minute per token and per team, and each team's token quota per period, counted across
console processes in fixed windows.

The request path reads memory only: each process counts locally and, every SYNC_S in the background, adds what it
counted to the shared rows (console/accounts/counters.py, one upsert) and reads back every process's totals. A
request is admitted while (the totals last synced + what this process counted since) is under the limit. The bound,
honestly: traffic through *other* processes within one sync interval is seen only at the next sync, so a window can
overshoot by what the other processes admit in SYNC_S (Kong's rate-limiting `sync_rate` works the same way).
Requests count at admission; tokens count when a request finishes (charge()), so a request is refused once its
window's tokens reached the limit, and the request that crosses it is not cut short."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from django.db import transaction

from console.accounts import counters
from console.accounts.counters import MINUTE, PERIODS, Window, quota_key, team_key, token_key
from console.dbthreads import own_thread

log = logging.getLogger("modelgrid.gateway")

SYNC_S = 0.5  # how often counts are shared: the most another process's traffic goes unseen
PRUNE_S = 300.0  # how often old windows' rows are deleted
ADJECTIVES = {"day": "daily", "week": "weekly", "month": "monthly"}


@dataclass(frozen=True)
class TeamLimits:
    name: str
    rpm: int | None = None
    tpm: int | None = None
    quota: int | None = None
    period: str = "month"


class Over(NamedTuple):
    """A limit a request would break: the words for the client, seconds until it resets, and the error code."""

    message: str
    retry_after: int
    code: str


class Limiter:
    """One console process's counts, and the limits of every team as last read."""

    def __init__(self) -> None:
        self.teams: dict[int, TeamLimits] = {}
        self.totals: dict[Window, tuple[int, int]] = {}  # every process's (requests, tokens), as last synced
        self.pending: dict[Window, list[int]] = {}  # this process's [requests, tokens, window end] since then
        self.sending: dict[Window, tuple[int, int, int]] = {}  # taken from pending, on their way to the database
        self._periods: dict[str, tuple[int, int]] = {}  # quota period -> its current (start, end)
        self._pruned = 0.0

    # --- the request path: memory only ---------------------------------------------------------------

    def admit(self, token_id: int, label: str, rpm: int | None, tpm: int | None, team_id: int,
              now: float | None = None) -> Over | None:
        """Count a request against its token's and its team's windows, or answer the limit it would break
        (nothing counted then)."""
        now = time.time() if now is None else now
        minute = int(now // MINUTE) * MINUTE
        resets = math.ceil(minute + MINUTE - now)  # whole seconds, rounded up: Retry-After is never early
        mine = (token_key(token_id), minute)
        if rpm is not None or tpm is not None:
            over = _per_minute(self._used(mine), rpm, tpm, f"token {label}", resets)
            if over:
                return over
        ours = (team_key(team_id), minute)
        team = self.teams.get(team_id)
        if team is not None:
            over = _per_minute(self._used(ours), team.rpm, team.tpm, f"team {team.name!r}", resets)
            if over:
                return over
            if team.quota is not None:
                start, end = self._period(team.period, now)
                used = self._used((quota_key(team_id, team.period), start))[1]
                if used >= team.quota:
                    at = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    every = ADJECTIVES.get(team.period, team.period)
                    return Over(f"quota exceeded: team {team.name!r} has used {used} tokens of its {team.quota}-token "
                                f"{every} token_quota; it resets at {at}, or an admin raises it (PATCH "
                                f"/api/v1/teams/{team.name})", math.ceil(end - now), "quota_exceeded")
        self._add(mine, minute + MINUTE, 1, 0)
        self._add(ours, minute + MINUTE, 1, 0)
        return None

    def charge(self, token_id: int, team_id: int, tokens: int, now: float | None = None) -> None:
        """Count a finished request's tokens (prompt and completion) against its token's and team's minute and the
        team's day, week and month (every period, so that a quota set or its period changed later counts them)."""
        if tokens <= 0:
            return
        now = time.time() if now is None else now
        minute = int(now // MINUTE) * MINUTE
        self._add((token_key(token_id), minute), minute + MINUTE, 0, tokens)
        self._add((team_key(team_id), minute), minute + MINUTE, 0, tokens)
        for period in PERIODS:
            start, end = self._period(period, now)
            self._add((quota_key(team_id, period), start), end, 0, tokens)

    def _used(self, window: Window) -> tuple[int, int]:
        requests, tokens = self.totals.get(window, (0, 0))
        if (going := self.sending.get(window)) is not None:
            requests, tokens = requests + going[0], tokens + going[1]
        mine = self.pending.get(window)
        return (requests, tokens) if mine is None else (requests + mine[0], tokens + mine[1])

    def _add(self, window: Window, until: int, requests: int, tokens: int) -> None:
        counts = self.pending.get(window)
        if counts is None:
            self.pending[window] = [requests, tokens, until]
        else:
            counts[0] += requests
            counts[1] += tokens

    def _period(self, period: str, now: float) -> tuple[int, int]:
        bounds = self._periods.get(period)
        if bounds is None or not bounds[0] <= now < bounds[1]:
            bounds = self._periods[period] = counters.period_bounds(period, now)
        return bounds

    # --- sharing the counts (background) ---------------------------------------------------------------

    async def sync(self) -> None:
        """Add this process's counts to the shared rows, read back every process's totals and the teams' limits.
        The counts sent are taken off this process's own at once, so they can never be sent twice; a failed sync gives
        them back, and one cancelled (the gateway closing) lets its database call finish first, so they are never
        lost either."""
        now = time.time()
        sent = {w: (c[0], c[1], c[2]) for w, c in self.pending.items() if c[0] or c[1]}
        for window in sent:
            del self.pending[window]
        self.sending = sent
        prune = now - self._pruned >= PRUNE_S
        call = asyncio.ensure_future(own_thread(_exchange)(sent, now, prune))
        try:
            totals, teams = await asyncio.shield(call)
        except asyncio.CancelledError:  # a call still queued would be dropped with what it carries: let it run
            await asyncio.wait([call])
            if call.exception() is not None:
                self._give_back(sent)
            raise
        except BaseException:  # rolled back: nothing of it was stored; the next sync carries it
            self._give_back(sent)
            raise
        finally:
            self.sending = {}
        if prune:
            self._pruned = now
        self.totals, self.teams = totals, teams

    def _give_back(self, sent: dict[Window, tuple[int, int, int]]) -> None:
        for window, (requests, tokens, until) in sent.items():
            self._add(window, until, requests, tokens)

    async def run(self, interval: float = SYNC_S) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sync()
            except Exception:  # the database may be briefly away: counts stay pending and go with the next sync
                log.exception("gateway: cannot share its limit counts")


def _per_minute(used: tuple[int, int], rpm: int | None, tpm: int | None, whose: str, resets: int) -> Over | None:
    if rpm is not None and used[0] >= rpm:
        return Over(f"rate limit: {whose} may make {rpm} requests per minute (its rpm_limit) and made them; retry in "
                    f"{resets} s", resets, "rate_limited")
    if tpm is not None and used[1] >= tpm:
        return Over(f"rate limit: {whose} may use {tpm} tokens per minute (its tpm_limit) and used {used[1]}; retry "
                    f"in {resets} s", resets, "rate_limited")
    return None


def _exchange(sent: dict[Window, tuple[int, int, int]], now: float,
              prune: bool) -> tuple[dict[Window, tuple[int, int]], dict[int, TeamLimits]]:
    from console.accounts.models import Team

    with transaction.atomic():  # the counts added and the totals read commit together, or not at all
        totals = counters.add_and_read(sent, now)
        teams = {pk: TeamLimits(name, rpm, tpm, quota, period) for pk, name, rpm, tpm, quota, period
                 in Team.objects.values_list("pk", "name", "rpm_limit", "tpm_limit", "token_quota", "quota_period")}
    if prune:
        counters.prune(now)
    return totals, teams
