"""The gateway's per-process traffic figures (console/gateway/bookkeeping.py): what the SLO loop and the charts
read."""

from console.gateway.bookkeeping import STATS_EVERY_S, WINDOW_S, Book


def figures(book: Book, now: float) -> dict:
    return book.drain({}, set(), now).stats


def test_the_figures_include_the_p95_wait_for_a_ready_replica():
    book = Book("console-a:1")
    for i in range(100):  # 95 requests served at once, 5 that waited a second for a replica to wake
        waited = 1.0 if i >= 95 else 0.0
        book.observe("chat", 0.05 + waited, 200, now=1000.0 + i * 0.1, queue_s=waited)
    chat = figures(book, 1010.0)["chat"]
    assert chat["requests"] == 100 and chat["queue_ms"] == 1000.0 and chat["p50_ms"] == 50.0
    assert chat["request_rate"] == round(100 / WINDOW_S, 3)


def test_a_quiet_window_has_no_queue_wait():
    book = Book("console-a:1")
    book.observe("chat", 0.01, 200, now=1000.0, queue_s=0.2)
    assert figures(book, 1001.0)["chat"]["queue_ms"] == 200.0
    assert figures(book, 1000.0 + WINDOW_S + STATS_EVERY_S + 1)["chat"]["queue_ms"] is None


def test_callers_that_do_not_say_waited_nothing():
    book = Book("console-a:1")
    book.observe("chat", 0.01, 500, now=1000.0)
    chat = figures(book, 1001.0)["chat"]
    assert chat["queue_ms"] == 0.0 and chat["error_rate"] == 1.0


def test_the_scheduler_is_woken_when_traffic_begins_not_with_every_figure(db, model_dir):
    from console.catalog.services import register_model
    from console.deployments.services import create_deployment
    from console.gateway.bookkeeping import write

    register_model("tiny", str(model_dir))
    create_deployment("chat", "tiny")
    book = Book("console-a:1")
    assert not write(book.drain({}, set(), 1000.0))  # no request yet: nothing to tell
    book.observe("chat", 0.01, 200, now=1001.0)
    assert write(book.drain({}, set(), 1001.0 + STATS_EVERY_S))  # its first requests: the scheduler plans with them
    book.observe("chat", 0.01, 200, now=1004.0)
    assert not write(book.drain({}, set(), 1001.0 + 2 * STATS_EVERY_S))  # more of the same: its ticks see them
    assert not write(book.drain({}, set(), 1000.0 + WINDOW_S + 4 * STATS_EVERY_S))  # the window emptied
    book.observe("chat", 0.01, 200, now=1000.0 + WINDOW_S + 5 * STATS_EVERY_S)
    assert write(book.drain({}, set(), 1000.0 + WINDOW_S + 6 * STATS_EVERY_S))  # traffic again
