"""Outputs rendered under mocks (scripts/review-infra, issue 28 item 19): a newcomer without Azure fills and prints
every job from them (--dry-run), and nothing that would reach Azure accepts them."""

import json
import pathlib

import pytest

from azureaccess import stack
from launcher import __main__ as cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "infra/review/dev-outputs.json"


def test_the_committed_rendered_outputs_are_current():
    from trainingplatform import review

    assert json.loads(COMMITTED.read_text()) == review.rendered_outputs(ROOT / "Pulumi.dev.yaml"), (
        "infra/review/dev-outputs.json is out of date: run scripts/review-infra dev and commit the result"
    )
    # The launcher and the renderer agree on the marker (two homes: the launcher installs without the infra).
    assert review.RENDERED == stack.RENDERED


@pytest.mark.parametrize("job", sorted(p.name for p in (ROOT / "jobs").glob("*.yaml")))
def test_every_job_fills_and_prints_from_them(job, capsys):
    cluster = "cpu-smoke" if "healthcheck" in job else "gpu-ib"
    code = cli.main([str(ROOT / "jobs" / job), "--stack-outputs", str(COMMITTED), "--cluster", cluster, "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("# stack outputs rendered under mocks") and "type: command" in out


def test_submission_and_the_checks_refuse_them(capsys):
    job = str(ROOT / "jobs/pytorch-resnet50-synthetic.yaml")
    assert cli.main([job, "--stack-outputs", str(COMMITTED), "--cluster", "gpu-ib", "--skip-quota-check"]) == 2
    err = capsys.readouterr().err
    assert "rendered under mocks by scripts/review-infra, not a deployed stack's" in err and "--dry-run" in err
    with pytest.raises(Exception, match="rendered under mocks"):
        stack.load_file(COMMITTED)  # doctor, preflight, cost and nodes load through this
    # A real stack's outputs (no marker) load as before.
    real = {k: v for k, v in json.loads(COMMITTED.read_text()).items() if k != stack.RENDERED}
    assert not stack.parse(real, "real").rendered
