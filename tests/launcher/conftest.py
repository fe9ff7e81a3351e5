"""The launcher's Azure ML tests share the fake Azure (fake_azureml.py) and a one-file code folder."""

import fake_azureml
import pytest


@pytest.fixture
def azure(monkeypatch) -> fake_azureml.FakeAzure:
    return fake_azureml.install(monkeypatch)


@pytest.fixture(scope="module")
def small_job(tmp_path_factory):
    """The synthetic job for the dev stack, with a one-file code folder: hashing the real checkout walks
    .venv (azure-ai-ml follows links), seconds per test that these tests do not need."""
    return tmp_path_factory.mktemp("code")
