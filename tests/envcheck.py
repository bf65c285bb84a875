"""What the suite needs from its machine: on CI (CI=true, as .ci/run is run) a missing piece
fails the run, since `make test` installs all of it there; on a developer's machine the tests
that need it skip, saying what is missing."""

import os

import pytest


def on_ci() -> bool:
    return os.environ.get("CI") == "true"


def missing(why: str):
    """Skip for lack of what the machine should have (fail on CI)."""
    if on_ci():
        pytest.fail(f"CI has to have this (make test installs it): {why}", pytrace=False)
    pytest.skip(why)
