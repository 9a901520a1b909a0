"""The one rule for names that end up in URL paths (models, adapters, deployments): the whole text must match,
so a name with a trailing newline is refused everywhere, not stored and then unreachable."""

import pytest
from django.core.exceptions import ValidationError

from console.catalog.models import Adapter, Model
from console.catalog.names import NAME_VALIDATOR, is_name, name_problem, validate_name
from console.deployments.models import Deployment
from console.errors import Invalid

HOSTILE = ["ghost\n", "ghost\r\n", "\nghost", "gho\nst", "ghost\x00", "ghost ", "ghost\t"]


@pytest.mark.parametrize("name", HOSTILE)
def test_it_refuses_a_name_with_a_control_character_or_a_space_anywhere(name):
    assert not is_name(name)
    with pytest.raises(ValidationError):
        NAME_VALIDATOR(name)
    with pytest.raises(Invalid) as refused:
        validate_name(name, "deployment")
    assert refused.value.errors[0]["loc"] == ["body", "name"]
    assert refused.value.status == 422


@pytest.mark.parametrize("name", ["a", "chat", "llama-3.1_8b", "x" * 63, "0"])
def test_it_takes_a_well_formed_name(name):
    assert is_name(name) and name_problem(name) is None
    NAME_VALIDATOR(name)
    validate_name(name, "model")


@pytest.mark.parametrize("name, problem", [
    ("ghost\n", "ends with a newline"),
    ("", "is empty"),
    ("x" * 64, "is 64 characters long, above 63"),
    ("Chat", "has 'C' at position 0"),
    ("gho\nst", "has '\\n' at position 3"),
    ("-chat", "must start and end with a letter or digit"),
    ("chat.", "must start and end with a letter or digit"),
    (3, "is not a string"),
])
def test_it_says_what_is_wrong_with_a_name(name, problem):
    assert problem in name_problem(name)
    with pytest.raises(Invalid) as refused:
        validate_name(name, "adapter")
    assert str(refused.value).startswith("adapter name ")
    assert problem in str(refused.value)


@pytest.mark.parametrize("row", [Model, Adapter, Deployment])
def test_the_rows_validate_their_names_by_the_same_rule(row):
    # What the admin and full_clean() check: the field validator, the same object as the API's.
    assert row._meta.get_field("name").validators[0] is NAME_VALIDATOR
