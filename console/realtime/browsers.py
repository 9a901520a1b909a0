"""The browser sockets this console process holds (the live dashboard's) and all the work they cost: admission
under the caps, one render per scope shared by every socket that shows it, and a socket's access checked again
when membership, a user or a session changes. None of it runs where agent links and the gateway wait.

Why: each socket used to hear every fleet change on a channel of its own and render its own page for it, on
Channels' one database thread, which agent links' hellos and desired states, Django's views and (on SQLite) the
gateway's and intake's database work share, and beside the event loop on the one interpreter lock: 1,500 sockets
of one member held 3-token completions 45-90 s and timed an agent link out (docs/benchmarks.md). Here a process
hears each change once (one channel-layer channel), renders each scope (teams, page) once per refresh on a thread
of its own, with at most RENDER_SHARE of the wall time, and pushes a socket only a page that changed, a slice of
sockets at a time, never waiting for one that reads slowly (it is owed the newest page instead).

The caps count this process's sockets only (a user behind a load balancer over P console processes may hold up
to P times MODELGRID_BROWSER_SOCKETS_PER_USER): counting across processes would put a channel-layer round trip on
every connect."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from django.conf import settings
from django.http import QueryDict
from django.template.loader import render_to_string

from console.control import hub as control
from console.control import layer
from console.dbthreads import apart, dedicated_thread
from console.fleet.views import grid_context
from console.realtime.access import Access, access_of, session_digest

log = logging.getLogger("modelgrid.realtime")

TOO_MANY = 4429  # close code: over a cap (htmx does not reconnect on 4xxx; the page shows the reason)
SIGNED_OUT = 4401  # close code: the session signs no one in any more
SIGNED_OUT_REASON = "Signed out (session ended, password changed or account disabled): sign in again."
# At most this share of the wall time goes to rendering pages, however many scopes are stale: renders hold the
# interpreter lock, and an event loop that waits for it after each system call answers agents and clients late.
RENDER_SHARE = 0.5
# Every socket's access is checked again this often, whatever was announced: a recheck message lost with the
# channel layer (Redis restarting) closes a removed member's view within this bound.
RECHECK_SECONDS = 300.0
# Pushes of one page are started this many at a time, the event loop's other work between: a thousand sockets'
# pushes at once (each compressed on its own) would hold every agent link and request behind all of them.
SEND_SLICE = 64
THREAD = dedicated_thread("browsers")  # their database work and renders; never Channels' thread


class Browser(Protocol):
    """A browser socket as the hub drives it (console/realtime/consumers.py DashboardConsumer)."""

    session_key: str
    access: Access
    query: str

    async def show(self, html: str) -> None: ...

    async def end(self, code: int, reason: str) -> None: ...


Scope = tuple  # (TeamScope, query string): what one render shows


@dataclass(eq=False)
class _Page:
    scope: Scope
    seats: set = field(default_factory=set)  # the Browsers showing it
    html: str | None = None
    stale: bool = True
    rendering: bool = False  # its sockets are pushed the render under way when it ends, those seated meanwhile too


@dataclass(eq=False)
class _Hub:
    pages: dict[Scope, _Page] = field(default_factory=dict)
    seated: dict = field(default_factory=dict)  # Browser -> its _Page
    shown: dict = field(default_factory=dict)  # Browser -> the html it was sent last
    owed: dict = field(default_factory=dict)  # Browser -> (its _Page, the html to push it next)
    pushing: dict = field(default_factory=dict)  # Browser -> the task pushing it (held: see tasks)
    per_user: dict[int, int] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    changed: bool = False  # the fleet changed since the last full refresh
    refreshed: float = float("-inf")  # loop time of the last full refresh
    joined: asyncio.Future | None = None
    rechecks: int = 0  # recheck messages heard so far
    tasks: set = field(default_factory=set)  # held: asyncio keeps only weak references


def _hub() -> _Hub:
    """This process's, kept on its hub (console/control/hub.py)."""
    here = control.hub()
    if here.browsers is None:
        here.browsers = _start()
    return here.browsers


def _start() -> _Hub:
    hub = _Hub()
    loop = asyncio.get_running_loop()
    hub.joined = loop.create_future()

    def on_joined() -> None:
        if not hub.joined.done():
            hub.joined.set_result(None)

    listener = loop.create_task(layer.listen(layer.DASHBOARD_GROUP, lambda m: _heard(hub, m), on_joined),
                                name="browsers-listen")
    listener.add_done_callback(lambda _: on_joined())
    for task in (listener, loop.create_task(_render_forever(hub), name="browsers-render"),
                 loop.create_task(_recheck_forever(hub), name="browsers-recheck")):
        hub.tasks.add(task)
    return hub


async def listening() -> None:
    """Start this process's listener unless it runs; return once it has joined the dashboards' group (or failed
    to: it keeps trying), so a socket admitted from now on hears every change after this."""
    await asyncio.shield(_hub().joined)


async def access(session_key: str | None) -> Access | None:
    """access_of on the browsers' thread."""
    return await apart(access_of, THREAD)(session_key)


def rechecks() -> int:
    """How many recheck messages this process has heard: for admit()."""
    return _hub().rechecks


def admit(browser: Browser, since: int) -> str | None:
    """Seat `browser` unless a cap is reached: then the reason, in words its user can act on (a close reason: at
    most 123 bytes). `since`: rechecks() before its access was read; if one was heard since, it is checked again."""
    hub = _hub()
    user = browser.access.user_id
    if len(hub.seated) >= settings.MODELGRID_BROWSER_SOCKETS:
        return (f"This console already holds {settings.MODELGRID_BROWSER_SOCKETS} live pages, its limit. "
                "Reload in a few minutes.")
    if hub.per_user.get(user, 0) >= settings.MODELGRID_BROWSER_SOCKETS_PER_USER:
        return (f"You have {settings.MODELGRID_BROWSER_SOCKETS_PER_USER} live pages open, the limit per user. "
                "Close some tabs, then reload.")
    hub.per_user[user] = hub.per_user.get(user, 0) + 1
    _seat(hub, browser)
    if hub.rechecks != since:
        _spawn(hub, _recheck(hub, {user}, set()))
    return None


def leave(browser: Browser) -> None:
    """`browser` closed (or was closed): it holds no seat any more. Safe to call twice."""
    hub = _hub()
    page = hub.seated.pop(browser, None)
    if page is None:
        return
    hub.shown.pop(browser, None)
    hub.owed.pop(browser, None)
    user = browser.access.user_id
    hub.per_user[user] -= 1
    if not hub.per_user[user]:
        del hub.per_user[user]
    page.seats.discard(browser)
    if not page.seats:
        del hub.pages[page.scope]


def _seat(hub: _Hub, browser: Browser) -> None:
    """On the page of its scope: shown the page rendered last at once if it is current, else in the next round."""
    scope = (browser.access.scope, browser.query)
    page = hub.pages.get(scope)
    if page is None:
        page = hub.pages[scope] = _Page(scope)
    page.seats.add(browser)
    hub.seated[browser] = page
    if page.rendering:
        return
    if page.html is not None and not page.stale:
        _owe(hub, page, browser, page.html)
    else:
        page.stale = True
        hub.wake.set()


def _spawn(hub: _Hub, coro) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    hub.tasks.add(task)
    task.add_done_callback(hub.tasks.discard)


def _heard(hub: _Hub, message: dict) -> None:
    if message.get("type") == "dashboard.recheck":
        hub.rechecks += 1
        users = message.get("users")
        _spawn(hub, _recheck(hub, None if users is None else set(users), set(message.get("ended") or ())))
    else:  # dashboard.update: the fleet changed
        hub.changed = True
        hub.wake.set()


async def _render_forever(hub: _Hub) -> None:
    while True:
        try:
            await _render_rounds(hub)
        except Exception:  # a bug, not a page: the live pages must not stop for good
            log.exception("the live pages' renderer failed; it starts again in a second")
            await asyncio.sleep(1.0)


async def _render_rounds(hub: _Hub) -> None:
    loop = asyncio.get_running_loop()
    while True:
        interval = settings.MODELGRID_DASHBOARD_REFRESH_SECONDS
        if hub.changed and loop.time() - hub.refreshed >= interval:
            hub.changed, hub.refreshed = False, loop.time()
            for page in hub.pages.values():
                page.stale = True
        stale = [page for page in hub.pages.values() if page.stale]
        if not stale:
            wait = hub.refreshed + interval - loop.time() if hub.changed else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hub.wake.wait(), wait)
            hub.wake.clear()
            continue
        for page in stale:
            if hub.pages.get(page.scope) is not page:
                continue  # its last socket left meanwhile
            page.stale, page.rendering = False, True
            began = time.monotonic()
            try:
                html = await apart(_render, THREAD)(page.scope)
            except Exception:
                log.exception("rendering a live page failed; its sockets keep the last one")
                continue
            finally:
                page.rendering = False
            took = time.monotonic() - began
            page.html = html
            due = [b for b in page.seats if hub.shown.get(b) != html]
            for first in range(0, len(due), SEND_SLICE):
                for browser in due[first:first + SEND_SLICE]:
                    _owe(hub, page, browser, html)
                await asyncio.sleep(0)  # what else is ready (an agent's message, a client's request) goes first
            await asyncio.sleep(took * (1 - RENDER_SHARE) / RENDER_SHARE)


def _render(scope: Scope) -> str:
    teams, query = scope
    # Only read through grid_context()'s lenient parsing: an odd value shows the default, never fails.
    return render_to_string("fleet/_live.html", grid_context(QueryDict(query), teams))


def _owe(hub: _Hub, page: _Page, browser: Browser, html: str) -> None:
    """Push `html` (of `page`) to `browser`; if a push to it is still under way (a socket that reads slowly waits
    for room to write), it gets only the newest page owed once that push ends, and nothing else waits for it."""
    hub.owed[browser] = page, html
    if browser not in hub.pushing:
        task = asyncio.get_running_loop().create_task(_push(hub, browser))
        hub.pushing[browser] = task


async def _push(hub: _Hub, browser: Browser) -> None:
    try:
        while (owed := hub.owed.pop(browser, None)) is not None:
            page, html = owed
            if hub.seated.get(browser) is not page:
                continue  # it left, or was moved to another scope, while the page rendered
            hub.shown[browser] = html
            try:
                await browser.show(html)
            except Exception as e:  # its socket just closed: its disconnect takes its seat
                log.debug("push to a browser socket lost (%s: %s)", type(e).__name__, e)
                return
    finally:
        hub.pushing.pop(browser, None)


async def _recheck(hub: _Hub, users: set[int] | None, ended: set[str]) -> None:
    """Check again the access of the sockets of `users` (None: all), one database read per session; close those
    of `ended` sessions and of sessions that sign no one in now, and move those whose teams changed to the page of
    their new scope."""
    sessions: dict[str, list] = {}
    for browser in list(hub.seated):
        if users is None or browser.access.user_id in users or session_digest(browser.session_key) in ended:
            sessions.setdefault(browser.session_key, []).append(browser)
    for key, browsers in sessions.items():
        try:
            now = None if session_digest(key) in ended else await access(key)
        except Exception:
            log.exception("re-checking a browser session failed; its sockets are closed to be safe")
            now = None
        for browser in browsers:
            if browser not in hub.seated:
                continue
            if now is None or now.user_id != browser.access.user_id:
                leave(browser)
                _spawn(hub, browser.end(SIGNED_OUT, SIGNED_OUT_REASON))
            elif now.scope != browser.access.scope:
                page = hub.seated[browser]
                page.seats.discard(browser)
                if not page.seats:
                    del hub.pages[page.scope]
                browser.access = now
                _seat(hub, browser)


async def _recheck_forever(hub: _Hub) -> None:
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        await _recheck(hub, None, set())
