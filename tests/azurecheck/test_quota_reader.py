"""The submission's quota check for the platform's users (issue 28, item 9), against a fake Azure (tests/fake_arm.py)
answering the documented shapes (learn.microsoft.com/rest/api/azureml: Usages - List, Virtual Machine Sizes - List,
Quotas - List, api-version 2024-04-01) and Azure's error bodies, raised by azure-core as HttpResponseError.

Workspace roles cannot read the subscription's Azure ML usages, so the stack gives its `users` a custom role that
can (access.QuotaReaders, config quotaReaderRole, default on); the check says where its numbers came from every time,
and when the read is refused, which role would have given it. Preflight checks that the deployer may define that role.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse

import fake_arm
import pytest
from azure.core.exceptions import ClientAuthenticationError
from test_preflight import ARM, CONTRIBUTOR, ML, SUB, dev_stack, lines, run, usage

from azureaccess import stack
from azureaccess.errors import JobError
from azurecheck import stackfile
from launcher import azureml
from trainingplatform import access

SOURCE = "quota read live from Azure ML (usages, VM sizes, quotas in westeurope) just now"
# The built-in Role Based Access Control Administrator's actions (learn.microsoft.com/azure/role-based-access-control/
# built-in-roles/privileged): role assignments, no role definitions.
RBAC_ADMINISTRATOR = [
    "Microsoft.Authorization/roleAssignments/write",
    "Microsoft.Authorization/roleAssignments/delete",
    "*/read",
    "Microsoft.Support/*",
]


def _outputs(dev_outputs, **changes) -> stack.StackOutputs:
    outputs = stack.load_file(dev_outputs)
    outputs.values["subscription_id"] = SUB
    outputs.values.update(changes)
    return outputs


def test_the_role_grants_exactly_what_the_quota_check_reads(azure, dev_outputs):
    # An ARM read's action is its provider and resource types with /read: .../locations/{location}/usages is
    # Microsoft.MachineLearningServices/locations/usages/read.
    azureml.check_quota(_outputs(dev_outputs), "cpu-smoke", 1, fake_arm.Credential())
    actions = set()
    for request in azure.requests:
        assert request.method == "GET"
        namespace, *rest = urllib.parse.urlsplit(request.url).path.split("/providers/", 1)[1].split("/")
        actions.add(f"{namespace}/{'/'.join(rest[0::2])}/read".lower())
    assert actions == {a.lower() for a in access.QUOTA_READ_ACTIONS}
    assert len(access.QUOTA_READ_ACTIONS) == 3


def test_a_live_check_says_its_source(azure, dev_outputs, capsys):
    azureml.check_quota(_outputs(dev_outputs), "cpu-smoke", 1, fake_arm.Credential())
    err = capsys.readouterr().err
    assert f"{SOURCE}: cpu-smoke: VM family standardDSv5Family, 4 vCPUs per node" in err
    # Busy now: a warning, then the source line.
    rows = [usage("vmFamily", "Standard DSv5 Family Cluster Dedicated vCPUs", 8, used=6)]
    azure.on("GET", rf"{ML}/usages", (200, {"value": rows}, {}))
    azureml.check_quota(_outputs(dev_outputs), "cpu-smoke", 2, fake_arm.Credential())
    err = capsys.readouterr().err
    assert "warning: [WARN] quota cpu-smoke:" in err and "2 are free now" in err
    assert f"{SOURCE}: cpu-smoke: fits, with the warnings above" in err
    # Never fits: refused, naming the source too.
    rows = [usage("vmFamily", "Standard DSv5 Family Cluster Dedicated vCPUs", 4)]
    azure.on("GET", rf"{ML}/usages", (200, {"value": rows}, {}))
    with pytest.raises(JobError, match=rf"above .*\({re.escape(SOURCE)}; --skip-quota-check submits anyway\)"):
        azureml.check_quota(_outputs(dev_outputs), "cpu-smoke", 2, fake_arm.Credential())


def test_a_refused_read_names_the_role_that_grants_it(azure, dev_outputs, capsys):
    refusal = fake_arm.arm_error(
        403,
        "AuthorizationFailed",
        "The client 'someone@example.com' with object id '33333333-3333-3333-3333-333333333333' does not have "
        "authorization to perform action 'Microsoft.MachineLearningServices/locations/usages/read' over scope "
        f"'/subscriptions/{SUB}' or the scope is invalid. If access was recently granted, please refresh your "
        "credentials.",
    )
    azure.on("GET", rf"{ML}/usages", refusal)
    outputs = _outputs(dev_outputs)
    role = outputs["quota_reader_role"]
    assert role.startswith("Azure ML quota reader (hvd-dev, subscription ")  # the stack's output, as rendered
    azureml.check_quota(outputs, "cpu-smoke", 1, fake_arm.Credential())  # submits anyway: no error
    err = capsys.readouterr().err
    assert (
        "warning: quota not checked (source: none; reading Azure ML quotas in westeurope: Azure refused it (403 " in err
    )
    assert f"through the role '{role}' on subscription {SUB}" in err and "`users`" in err
    assert err.rstrip().endswith("submitting anyway")
    # A stack without the role (quotaReaderRole: false, or deployed before it) says how to get one.
    azureml.check_quota(_outputs(dev_outputs, quota_reader_role=None), "cpu-smoke", 1, fake_arm.Credential())
    err = capsys.readouterr().err
    assert "(source: none;" in err and "this stack grants its users no quota read" in err
    assert "quotaReaderRole: true" in err and "docs/deploying.md#who-can-use-it" in err
    # Not signed in is not a missing role.
    azureml.check_quota(
        outputs, "cpu-smoke", 1, fake_arm.Credential(error=ClientAuthenticationError("DefaultAzureCredential failed"))
    )
    err = capsys.readouterr().err
    assert "(source: none;" in err and "not signed in" in err and "quota reader" not in err


def test_preflight_checks_the_right_to_define_the_role(azure):
    code, out = run(dev_stack())  # an Owner
    block = lines(out, "quota reader role")
    assert code == 0 and "[  ok] quota reader role: Microsoft.Authorization/roleDefinitions/write allowed on" in block
    assert f"roleAssignments/write allowed on /subscriptions/{SUB}" in block
    # Contributor plus Role Based Access Control Administrator: assignments yes, role definitions no.
    both = {"value": CONTRIBUTOR["value"] + [{"actions": RBAC_ADMINISTRATOR, "notActions": []}]}
    azure.on("GET", rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.Authorization/permissions", (200, both, {}))
    code, out = run(dev_stack())
    block = lines(out, "quota reader role")
    assert code == 1, out
    assert (
        f"[FAIL] quota reader role: you may not Microsoft.Authorization/roleDefinitions/write on /subscriptions/{SUB}"
        in (block)
    )
    assert "User Access Administrator" in block and "quotaReaderRole: false" in block
    assert "[  ok] permissions: Microsoft.Authorization/roleAssignments/write allowed" in lines(out, "permissions")
    # Without the role nothing is asked of the subscription.
    plain = dev_stack()
    plain = stackfile.StackFile(dataclasses.replace(plain.settings, quota_reader_role=False), SUB)
    code, out = run(plain)
    assert code == 0 and "quota reader role" not in out, out
