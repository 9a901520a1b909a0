"""Requests and tokens per minute per token and per team, and each team's token quota per period, counted across
console processes in fixed windows.

The request path reads memory only: each process counts locally and, every SYNC_S in the background, adds what it
counted to the shared rows (console/accounts/counters.py, one upsert) and reads back every process's totals. Requests
count at admission. Tokens are reserved at admission: the most the request may use (reservation.py), held in the
windows of the token limits set, until it ends and settle() swaps the reservation for what the engine said it used,
counted in the minute and the period it was admitted in. A request is admitted while (the tokens used, as last synced
and counted here since) + (the reservations in flight: this process's, and the others' as last synced) + its own
reservation stays within each limit; one that could never fit (its reservation alone is over a whole limit) is
refused for good (400), not told to retry. Each process shares the reservations it holds at every sync too, and
stops counting for the others once it has not synced for STALE_S (a console that died holds nothing for long).

The bound, honestly: one process alone never lets a window's tokens past a limit (a reservation bounds what its
request can use), so it overshoots by at most what a request used beyond its reservation. Traffic through *other*
processes is seen only at their next sync and this one's next read (up to 2 x SYNC_S after it was admitted), so with
several consoles a window can overshoot by what the others admit in that time (Kong's rate-limiting `sync_rate`
works the same way); however a burst splits, each console admits at most the room it saw."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from django.db import transaction

from console.accounts import counters
from console.accounts.counters import MINUTE, PERIODS, Window, quota_key, team_key, token_key
from console.dbthreads import own_thread
from console.gateway.reservation import NOTHING, Need

log = logging.getLogger("modelgrid.gateway")

SYNC_S = 0.5  # how often counts are shared: the most another process's traffic goes unseen
PRUNE_S = 300.0  # how often old windows' rows are deleted
STALE_S = 10.0  # a process's reservations count for the others while it synced this recently (it may have died)
IN_FLIGHT_RETRY_S = 1  # Retry-After when only requests in flight stand in the way: their reservations settle soon
ADJECTIVES = {"day": "daily", "week": "weekly", "month": "monthly"}


@dataclass(frozen=True)
class TeamLimits:
    name: str
    rpm: int | None = None
    tpm: int | None = None
    quota: int | None = None
    period: str = "month"


class Over(NamedTuple):
    """A limit a request would break: the words for the client, seconds until it resets (None: retrying will not
    help), the error code, and the HTTP status."""

    message: str
    retry_after: int | None
    code: str
    status: int = 429


@dataclass(eq=False)
class Hold:
    """An admitted request's reservation: `tokens` held in `windows` (those of the token limits set when it was
    admitted, `at`) until settle() swaps them for what it used."""

    token_id: int
    team_id: int
    at: float
    tokens: int
    windows: tuple[Window, ...]
    settled: bool = False


class _Bound(NamedTuple):
    """A token limit that binds a request: the window it counts in, the window's end, the limit, and whose it is (a
    team's, else the token's `label` and id: words made only for a refusal)."""

    window: Window
    until: int
    limit: int
    team: TeamLimits | None
    label: str = ""
    token_id: int = 0

    @property
    def whose(self) -> str:
        return f"team {self.team.name!r}" if self.team else f"token {self.label}"

    @property
    def what(self) -> str:
        if self.team is None or self.window[0].startswith("team:"):
            return "tpm_limit"
        return f"{ADJECTIVES.get(self.team.period, self.team.period)} token_quota"

    @property
    def raise_it(self) -> str:
        return f"PATCH /api/v1/teams/{self.team.name}" if self.team else f"PATCH /api/v1/tokens/{self.token_id}"


class Limiter:
    """One console process's counts and reservations, and the limits of every team as last read."""

    def __init__(self, console: str = "") -> None:
        # Unique per Limiter, not per process: tests run two gateways in one; a restarted pid is another console.
        self.console = console or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.teams: dict[int, TeamLimits] = {}
        self.totals: dict[Window, tuple[int, int]] = {}  # every process's (requests, tokens), as last synced
        self.pending: dict[Window, list[int]] = {}  # this process's [requests, tokens, window end] since then
        self.sending: dict[Window, tuple[int, int, int]] = {}  # taken from pending, on their way to the database
        self.held: dict[Window, list[int]] = {}  # this process's reservations in flight: [tokens, window end]
        self.others: dict[Window, int] = {}  # every other process's reservations in flight, as last synced
        self._periods: dict[str, tuple[int, int]] = {}  # quota period -> its current (start, end)
        self._pruned = 0.0
        self._stamp = 0.0  # the last sync's stamp on this process's reservations (LimitHold.seen)
        self._holding = False  # whether the database may hold reservations of this process's

    # --- the request path: memory only ---------------------------------------------------------------

    def admit(self, token_id: int, label: str, rpm: int | None, tpm: int | None, team_id: int,
              now: float | None = None, need: Need = NOTHING, again: bool = False) -> Over | Hold:
        """Count a request against its token's and its team's windows and hold its reservation (`need`), or answer
        the limit it would break (nothing counted or held then). `again`: a route's fallback for a request admitted
        once already: its reservation is held, nothing is counted or refused twice."""
        now = time.time() if now is None else now
        minute = int(now // MINUTE) * MINUTE
        mine, ours = (token_key(token_id), minute), (team_key(team_id), minute)
        team = self.teams.get(team_id)
        theirs = self._team_bounds(team_id, team, minute, now)
        bounds = [_Bound(mine, minute + MINUTE, tpm, None, label, token_id), *theirs] if tpm is not None else theirs
        if not again:
            over = self._refusal(need, rpm, label, team, mine, ours, bounds, theirs, now)
            if over is not None:
                return over
            self._add(mine, minute + MINUTE, 1, 0)
            self._add(ours, minute + MINUTE, 1, 0)
        if not need.tokens:
            return Hold(token_id, team_id, now, 0, ())
        for b in bounds:
            self.held.setdefault(b.window, [0, b.until])[0] += need.tokens
        return Hold(token_id, team_id, now, need.tokens, tuple(b.window for b in bounds))

    def settle(self, hold: Hold, tokens: int) -> None:
        """Swap a finished request's reservation for the `tokens` it used, counted when it was admitted (once)."""
        if hold.settled:
            return
        hold.settled = True
        for window in hold.windows:
            entry = self.held[window]
            entry[0] -= hold.tokens
            if entry[0] <= 0:
                del self.held[window]
        self.charge(hold.token_id, hold.team_id, tokens, hold.at)

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

    def _refusal(self, need: Need, rpm: int | None, label: str, team: TeamLimits | None, mine: Window, ours: Window,
                 bounds: list[_Bound], theirs: list[_Bound], now: float) -> Over | None:
        """The first limit a request would break: one it could never fit first (retrying cannot help), then the
        token's requests and tokens per minute, then the team's, its quota last."""
        for b in bounds:
            if need.tokens > b.limit:
                return _never(need, b)
        resets = math.ceil(mine[1] + MINUTE - now)  # whole seconds, rounded up: Retry-After is never early
        if rpm is not None and self._used(mine)[0] >= rpm:
            return _requests(f"token {label}", rpm, resets)
        if bounds and bounds[0].window == mine and (over := self._tokens(bounds[0], need, now)) is not None:
            return over
        if team is not None and team.rpm is not None and self._used(ours)[0] >= team.rpm:
            return _requests(f"team {team.name!r}", team.rpm, resets)
        return next((over for b in theirs if (over := self._tokens(b, need, now)) is not None), None)

    def _team_bounds(self, team_id: int, team: TeamLimits | None, minute: int, now: float) -> list[_Bound]:
        if team is None:
            return []
        bounds = []
        if team.tpm is not None:
            bounds.append(_Bound((team_key(team_id), minute), minute + MINUTE, team.tpm, team))
        if team.quota is not None:
            start, end = self._period(team.period, now)
            bounds.append(_Bound((quota_key(team_id, team.period), start), end, team.quota, team))
        return bounds

    def _tokens(self, b: _Bound, need: Need, now: float) -> Over | None:
        used = self._used(b.window)[1]
        reserved = self._reserved(b.window)
        if used + reserved + max(need.tokens, 1) <= b.limit:  # a request that reserves nothing still needs room
            return None
        # Only requests in flight stand in the way: their reservations settle as they end, long before the reset.
        wait = math.ceil(b.until - now)
        if used + max(need.tokens, 1) <= b.limit:
            wait = min(wait, IN_FLIGHT_RETRY_S)
        held = f", {reserved} more are reserved by requests in flight" if reserved else ""
        asks = f"; this request may use up to {need.tokens}" if need.tokens else ""
        if b.what == "tpm_limit":
            return Over(f"rate limit: {b.whose} may use {b.limit} tokens per minute (its tpm_limit) and used {used}"
                        f"{held}{asks}; retry in {wait} s", wait, "rate_limited")
        at = datetime.fromtimestamp(b.until, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return Over(f"quota exceeded: {b.whose} has used {used} tokens of its {b.limit}-token {b.what}{held}{asks}; "
                    f"it resets at {at}, or an admin raises it ({b.raise_it})", wait, "quota_exceeded")

    def _used(self, window: Window) -> tuple[int, int]:
        requests, tokens = self.totals.get(window, (0, 0))
        if (going := self.sending.get(window)) is not None:
            requests, tokens = requests + going[0], tokens + going[1]
        mine = self.pending.get(window)
        return (requests, tokens) if mine is None else (requests + mine[0], tokens + mine[1])

    def _reserved(self, window: Window) -> int:
        held = self.held.get(window)
        return (held[0] if held else 0) + self.others.get(window, 0)

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
        """Add this process's counts to the shared rows and put its reservations in flight there, read back every
        process's totals and the other processes' reservations, and the teams' limits. The counts sent are taken off
        this process's own at once, so they can never be sent twice; a failed sync gives them back, and one cancelled
        (the gateway closing) lets its database call finish first, so they are never lost either. Reservations are
        sent whole each time (a row per window, replaced), so nothing of theirs is ever sent twice."""
        now = time.time()
        sent = {w: (c[0], c[1], c[2]) for w, c in self.pending.items() if c[0] or c[1]}
        for window in sent:
            del self.pending[window]
        self.sending = sent
        held = {w: (h[0], h[1]) for w, h in self.held.items()}
        write = bool(held) or self._holding  # (most syncs of a console without token limits have none to write)
        # Each sync's stamp above the last, even where the clock stands still or steps back: a row not stamped by
        # this one is a reservation released since the last, and goes.
        stamp = self._stamp = max(now, self._stamp + 0.001)
        prune = now - self._pruned >= PRUNE_S
        call = asyncio.ensure_future(own_thread(_exchange)(sent, self.console, held if write else None, stamp, now,
                                                            prune))
        try:
            totals, others, teams = await asyncio.shield(call)
            self._holding = bool(held)
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
        self.totals, self.others, self.teams = totals, others, teams

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


def _requests(whose: str, rpm: int, resets: int) -> Over:
    return Over(f"rate limit: {whose} may make {rpm} requests per minute (its rpm_limit) and made them; retry in "
                f"{resets} s", resets, "rate_limited")


def _never(need: Need, b: _Bound) -> Over:
    fits = need.completion_within(b.limit) if need.completion else 0
    fewer = f"ask for at most {fits} completion tokens (max_tokens)" if fits else "send a shorter request"
    per = " per minute" if b.what == "tpm_limit" else ""
    return Over(f"this request may use {need}, more than the {b.limit} tokens{per} of {b.whose}'s whole {b.what}, so "
                f"it can never be admitted: {fewer}, or have the limit raised ({b.raise_it})", None, "exceeds_limit",
                400)


def _exchange(sent: dict[Window, tuple[int, int, int]], console: str, held: dict[Window, tuple[int, int]] | None,
              stamp: float, now: float, prune: bool) -> tuple[dict[Window, tuple[int, int]], dict[Window, int],
                                                dict[int, TeamLimits]]:
    from console.accounts.models import Team

    with transaction.atomic():  # the counts added and the totals read commit together, or not at all
        counters.add(sent)
        if held is not None:
            counters.hold(console, held, stamp)
        # The others' reservations before the totals: a settle committed between the two reads is then counted
        # twice (its reservation and its tokens), never not at all.
        others = counters.held_by_others(console, now - STALE_S, now)
        totals = counters.read(now)
        teams = {pk: TeamLimits(name, rpm, tpm, quota, period) for pk, name, rpm, tpm, quota, period
                 in Team.objects.values_list("pk", "name", "rpm_limit", "tpm_limit", "token_quota", "quota_period")}
    if prune:
        counters.prune(now)
    return totals, others, teams
