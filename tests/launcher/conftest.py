import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dev_outputs(tmp_path_factory) -> pathlib.Path:
    """The dev stack's outputs as the mocked Pulumi program produces them, saved like `pulumi stack output --json`."""
    from trainingplatform import mocked

    raw, location = mocked.read_stack_file(ROOT / "Pulumi.dev.yaml")
    _, outputs = mocked.run(raw, "dev", location)
    path = tmp_path_factory.mktemp("stack") / "outputs.dev.json"
    path.write_text(json.dumps(outputs))
    return path
