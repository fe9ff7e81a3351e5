import os
import subprocess
import sys

from infra_helpers import DATA_DEV_FILE, DATA_PROD_FILE, DEV_FILE, ROOT

from trainingplatform import review


def test_committed_review_files_are_current():
    for stack_file, review_file in (
        (DEV_FILE, "dev.txt"),
        (DATA_DEV_FILE, "data-dev.txt"),
        (DATA_PROD_FILE, "data-prod.txt"),
    ):
        current = (ROOT / "infra" / "review" / review_file).read_text()
        assert review.render(stack_file) == current, (
            f"infra/review/{review_file} is out of date: run scripts/review-infra dev and commit the result"
        )


def test_review_names_the_key_settings_and_fails_cleanly_on_bad_config(tmp_path):
    text = review.render(DEV_FILE)
    assert 'vmSize = "Standard_ND96asr_v4"' in text and "[protected]" not in text
    data_text = review.render(DATA_DEV_FILE)
    assert "azure-native:storage:StorageAccount storage-data  [protected]" in data_text
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(DEV_FILE.read_text().replace("Standard_ND96asr_v4", "Standard_NC24rs_v3"))
    proc = subprocess.run(
        [sys.executable, "-m", "trainingplatform.review", str(bad)], cwd=ROOT / "infra", capture_output=True, text=True
    )
    assert proc.returncode == 2 and "retired by Azure on 2025-09-30" in proc.stderr


def test_the_render_does_not_depend_on_who_runs_it(tmp_path, monkeypatch):
    # A CI agent signed in as a service principal (ARM_* variables, or `az login --service-principal`, which
    # azureProfile.json records) renders the same file: the render is what the stack declares.
    (tmp_path / "azureProfile.json").write_text(
        '{"subscriptions": [{"id": "00000000-0000-0000-0000-000000000000", "isDefault": true, '
        '"user": {"name": "ci-app", "type": "servicePrincipal"}}]}',
        "utf-8-sig",
    )
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("ARM_CLIENT_ID", "44444444-4444-4444-4444-444444444444")
    assert review.render(DEV_FILE) == (ROOT / "infra" / "review" / "dev.txt").read_text()
    assert os.environ["AZURE_CONFIG_DIR"] == str(tmp_path) and os.environ["ARM_CLIENT_ID"].startswith("4444")
