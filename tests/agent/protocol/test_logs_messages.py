"""logs_request (console -> agent) and its logs reply (agent -> console): dispatched on their type, bounded like
the other messages."""

import json

import pytest
from pydantic import ValidationError

from agent.protocol import MAX_LOG_LINES, LogsReply, LogsRequest, dump, parse_agent_message, parse_console_message


def test_a_logs_request_round_trips_and_asks_for_100_lines_by_default():
    request = parse_console_message('{"type": "logs_request", "request_id": "a1", "replica_id": 7}')
    assert request == LogsRequest(request_id="a1", replica_id=7, tail=100)
    assert parse_console_message(dump(LogsRequest(request_id="b", replica_id=2**63 - 1, tail=1000))).tail == 1000


@pytest.mark.parametrize("fields", [
    {"tail": 0}, {"tail": 1001}, {"replica_id": -1}, {"request_id": ""}, {"request_id": "x" * 65},
    {"request_id": "a\u0000b"}, {"lines": []},
])
def test_a_logs_request_out_of_bounds_is_refused(fields):
    with pytest.raises(ValidationError):
        parse_console_message(json.dumps({"type": "logs_request", "request_id": "a", "replica_id": 7} | fields))


def test_a_logs_reply_round_trips_with_its_lines_or_its_error():
    reply = LogsReply(request_id="a1", replica_id=7, lines=["one", "two"])
    assert parse_agent_message(dump(reply)) == reply and reply.error == ""
    refused = parse_agent_message('{"type": "logs", "request_id": "a1", "replica_id": 7, "error": "no log"}')
    assert isinstance(refused, LogsReply) and refused.lines == [] and refused.error == "no log"


def test_a_logs_reply_cuts_long_lines_and_refuses_too_many():
    reply = parse_agent_message(json.dumps({"type": "logs", "request_id": "a", "replica_id": 1,
                                            "lines": ["x" * 5000, "nul\u0000here"], "error": "e" * 9000}))
    assert len(reply.lines[0]) == 1000 and reply.lines[0].endswith("…") and reply.lines[1] == "nulhere"
    assert len(reply.error) == 4000
    with pytest.raises(ValidationError, match="lines"):
        parse_agent_message(json.dumps({"type": "logs", "request_id": "a", "replica_id": 1,
                                        "lines": ["x"] * (MAX_LOG_LINES + 1)}))
    with pytest.raises(ValidationError, match="request_id"):
        parse_agent_message('{"type": "logs", "replica_id": 1, "lines": []}')
