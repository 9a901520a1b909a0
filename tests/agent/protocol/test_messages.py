import pytest
from pydantic import ValidationError

from agent.protocol import (
    DesiredReplica,
    DesiredState,
    Hello,
    ReplicaStatus,
    dump,
    parse_agent_message,
    parse_console_message,
)


def test_it_round_trips_a_desired_state():
    state = DesiredState(
        generation=3,
        replicas=[
            DesiredReplica(
                id=1, deployment="m", model_path="/m", architecture="LlamaForCausalLM", gpus=[0], reserved_bytes=10
            )
        ],
    )
    assert parse_console_message(dump(state)) == state


def test_a_desired_state_carries_the_gateway_secret_and_an_older_console_may_leave_it_out():
    state = parse_console_message('{"type": "desired_state", "generation": 1, "replicas": [], "gateway_secret": "s3"}')
    assert state.gateway_secret == "s3" and parse_console_message(dump(state)) == state
    assert "s3" not in repr(state)  # not in logs by way of a repr
    assert parse_console_message('{"type": "desired_state", "generation": 1, "replicas": []}').gateway_secret == ""


def test_it_dispatches_agent_messages_on_their_type():
    msg = parse_agent_message('{"type": "replica_status", "replica_id": 4, "state": "ready", "measured_bytes": 7}')
    assert isinstance(msg, ReplicaStatus) and msg.measured_bytes == 7


def test_it_refuses_an_unknown_type():
    with pytest.raises(ValidationError):
        parse_agent_message('{"type": "launch_missiles"}')


def test_it_refuses_unknown_fields_and_bad_states():
    with pytest.raises(ValidationError):
        parse_agent_message('{"type": "ack", "generation": 1, "extra": true}')
    with pytest.raises(ValidationError):
        parse_agent_message('{"type": "replica_status", "replica_id": 1, "state": "dancing"}')


def test_a_hello_needs_a_host_name():
    with pytest.raises(ValidationError):
        Hello(protocol=1, host="", agent_version="0", endpoint="http://x", gpus=[])
