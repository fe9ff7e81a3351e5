"""The logs account's lifecycle rule: previous versions of run outputs (checkpoints above all) expire; current
versions stay.

Azure's documented constraints this rule relies on ("Azure Blob Storage lifecycle management policy
structure", learn.microsoft.com/azure/storage/blobs/lifecycle-management-policy-structure):
- a storage account has one management policy, and its name is "default";
- prefixMatch: up to 10 case-sensitive prefixes per rule, each starting with the container name, matched
  literally ("Prefix strings don't support wildcard matching. Characters such as * and ? are treated as
  string literals");
- the version action's daysAfterCreationGreaterThan ages a previous version from when it was first written.
"""

import copy

import yaml
from infra_helpers import ROOT, one

from trainingplatform import mocked, storage


def _policy(mocks):
    policies = mocks.of_type("ManagementPolicy")
    assert len(policies) == 1, [p.name for p in policies]
    return policies[0]


def test_the_logs_account_expires_previous_versions_under_runs_and_nothing_else(dev_data):
    mocks, _ = dev_data
    policy = _policy(mocks)
    logs = one(mocks, "StorageAccount", "storage-logs")
    assert policy.inputs["accountName"] == logs.inputs["accountName"]
    assert policy.inputs["managementPolicyName"] == "default"
    [rule] = policy.inputs["policy"]["rules"]
    assert rule["enabled"] is True and rule["type"] == "Lifecycle"
    assert rule["definition"]["filters"] == {"blobTypes": ["blockBlob"], "prefixMatch": ["logs/runs/"]}
    # Only previous versions: no baseBlob action (the current checkpoint a job resumes from, the metrics a
    # user reads) and no snapshot action.
    assert rule["definition"]["actions"] == {"version": {"delete": {"daysAfterCreationGreaterThan": 7}}}
    # The account versions its blobs: without versioning the rule would have nothing to act on.
    service = one(mocks, "BlobServiceProperties", "storage-logs-blob-service").inputs
    assert service["isVersioningEnabled"] is True
    # Protected like every resource of the data stack.
    assert policy.name in mocks.protected


def test_the_prefix_follows_the_configured_logs_container(dev_data_raw):
    raw, location = copy.deepcopy(dev_data_raw[0]), dev_data_raw[1]
    raw["storage"]["logsContainer"] = "outputs"
    mocks, _ = mocked.run_data(raw, "dev", location)
    [rule] = _policy(mocks).inputs["policy"]["rules"]
    assert rule["definition"]["filters"]["prefixMatch"] == ["outputs/runs/"]


def test_prefixes_keep_to_what_azure_accepts():
    rule = storage.run_versions_rule("logs")
    prefixes = rule.definition.filters.prefix_match
    assert 1 <= len(prefixes) <= 10
    for prefix in prefixes:
        assert prefix.startswith("logs/")  # starts with the container name
        assert not set("*?") & set(prefix)  # would be matched literally, matching nothing
    assert rule.definition.actions.version.delete.days_after_creation_greater_than >= 1


def _logs_output_folders():
    """(job file, folder inside the logs container) of every job output written to the logs datastore."""
    for job in sorted((ROOT / "jobs").glob("*.yaml")):
        spec = yaml.safe_load(job.read_text())
        for out in (spec.get("outputs") or {}).values():
            path = (out or {}).get("path", "")
            head = "azureml://datastores/<<logs>>/paths/"
            if path.startswith(head):
                yield job.name, path[len(head) :]


def test_every_training_jobs_checkpoints_fall_under_the_rule_and_health_checks_do_not():
    """The payloads write checkpoints to OUTPUT/checkpoints/; every training job's OUTPUT is under runs/, so
    the rule reaches each job's checkpoints with one literal prefix, whatever the job's name."""
    [prefix] = storage.run_versions_rule("logs").definition.filters.prefix_match
    folders = dict(_logs_output_folders())
    training = {job: folder for job, folder in folders.items() if not job.startswith("healthcheck")}
    assert len(training) >= 8
    for job, folder in training.items():
        blob = "logs/" + folder.replace("${{name}}", "witty_jackal_3d4kq79d3v") + "checkpoints/checkpoint-epoch-0001.pt"
        assert blob.startswith(prefix), job
    assert not ("logs/" + folders["healthcheck-allreduce.yaml"]).startswith(prefix)
