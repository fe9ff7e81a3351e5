"""The Azure of test_preflight.working_azure (preflight passes there for the dev stack), for every test here that
takes `azure`."""

import pytest
from test_preflight import working_azure


@pytest.fixture
def azure(monkeypatch):
    return working_azure(monkeypatch)
