"""Whose token the tools use (issue 28, item 5), on a simulated jump host: the VM's managed identity answers at
the instance metadata endpoint (fake_arm at the HTTP boundary, where azure-identity's ManagedIdentityCredential
asks), and the person's `az login` answers at the Azure CLI's process boundary (an `az` on PATH printing what
`az account get-access-token --output json` prints). Azure authorizes the person and refuses the VM's identity,
with ARM's own 403 body, raised by azure-core as HttpResponseError.

Why it matters there: Entra ID SSH sign-in needs the VM's system-assigned managed identity ("Ensure that your VM
is configured with the following functionality: System-assigned managed identity",
learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux), and DefaultAzureCredential tries it
before the Azure CLI: "3. An Azure managed identity. ... 6. The identity currently logged in to the Azure CLI."
(azure-identity 1.27.0, DefaultAzureCredential's docstring, the version .venv pins).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import time

import fake_arm
import pytest
import urllib3
from azure.core.exceptions import HttpResponseError
from test_doctor import IMAGES, World
from test_preflight import SUB, dev_stack

from azureaccess import stack
from azurecheck import doctor, images, preflight
from launcher import azureml, checkpoints

VM = {
    "oid": "55555555-5555-5555-5555-555555555555",
    "idtyp": "app",
    "appid": "66666666-6666-6666-6666-666666666666",
    "tid": "11111111-1111-1111-1111-111111111111",
    "xms_mirid": "/subscriptions/00000000-0000-0000-0000-000000000000/resourcegroups/hvd-prod-rg/providers/"
    "Microsoft.Compute/virtualMachines/wayin-jumphost1a2b3c",
}
USER = dict(fake_arm.USER, tid="11111111-1111-1111-1111-111111111111")
# Everything that steers azure-identity's chain from the environment: none of it is set on the jump host.
STEERING = (
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AZURE_USERNAME",
    "AZURE_PASSWORD",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_TOKEN_CREDENTIALS",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "MSI_ENDPOINT",
    "MSI_SECRET",
    "IMDS_ENDPOINT",
    "AZURE_POD_IDENTITY_AUTHORITY_HOST",
)


def _helper():
    from azureaccess import credential  # the one place the tools' credential is made

    return credential


def _claims_of(authorization: str | None) -> dict:
    token = (authorization or "").removeprefix("Bearer ")
    payload = token.split(".")[1] if token.count(".") == 2 else ""
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))) if payload else {}


def on_the_jump_host(monkeypatch, tmp_path, fake: fake_arm.FakeAzure):
    """The jump host around `fake`: the VM's identity at IMDS, the person's login in the Azure CLI."""
    for name in STEERING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no developer token caches but the CLI's
    fake.on(
        "GET",
        r"169\.254\.169\.254/metadata/identity/oauth2/token",
        lambda request, m: (
            200,
            {
                "access_token": fake_arm.jwt(VM),
                "expires_in": "3599",
                "expires_on": str(int(time.time()) + 3599),
                "resource": "https://management.azure.com/",
                "token_type": "Bearer",
            },
            {},
        ),
    )
    answer = {
        "accessToken": fake_arm.jwt(USER),
        "expiresOn": time.strftime("%Y-%m-%d %H:%M:%S.000000", time.localtime(time.time() + 3600)),
        "expires_on": int(time.time()) + 3600,
        "subscription": SUB,
        "tenant": USER["tid"],
        "tokenType": "Bearer",
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    az = bin_dir / "az"
    az.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(answer)}\nEOF\n")
    az.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return fake


def azure_authorizes_the_user_only(fake: fake_arm.FakeAzure) -> None:
    """ARM and storage refuse any token but the person's, as Azure does for an identity without the role."""
    for i, (method, pattern, answer) in enumerate(list(fake.routes)):

        def guarded(request, m, answer=answer):
            claims = _claims_of(request.headers.get("Authorization"))
            host = urllib3.util.parse_url(request.url).host or ""
            if (host == "management.azure.com" or ".blob.core." in host) and claims.get("oid") != USER["oid"]:
                if ".blob.core." in host:  # Azure Storage's error body and code header
                    body = (
                        b'<?xml version="1.0" encoding="utf-8"?><Error><Code>AuthorizationPermissionMismatch</Code>'
                        b"<Message>This request is not authorized to perform this operation using this "
                        b"permission.</Message></Error>"
                    )
                    return (
                        403,
                        body,
                        {"x-ms-error-code": "AuthorizationPermissionMismatch", "Content-Type": "application/xml"},
                    )
                return fake_arm.arm_error(
                    403,
                    "AuthorizationFailed",
                    f"The client '{claims.get('appid')}' with object id '{claims.get('oid')}' does not have "
                    "authorization to perform action 'Microsoft.MachineLearningServices/workspaces/read'",
                )
            return answer(request, m) if callable(answer) else answer

        fake.routes[i] = (method, pattern, guarded)


@pytest.fixture
def jump_host_world(monkeypatch, tmp_path, dev_outputs):
    monkeypatch.setattr(images, "job_images", lambda: dict(IMAGES))
    fake = fake_arm.install(monkeypatch)
    world = World(fake, stack.load_file(dev_outputs))
    on_the_jump_host(monkeypatch, tmp_path, fake)
    azure_authorizes_the_user_only(fake)
    return world


def test_the_installed_chain_tries_the_managed_identity_before_the_cli():
    # The documented order this whole item rests on, as the installed azure-identity builds it.
    from azure.identity import DefaultAzureCredential

    names = [type(c).__name__ for c in DefaultAzureCredential().credentials]
    assert names.index("ManagedIdentityCredential") < names.index("AzureCliCredential")


def test_doctor_on_the_jump_host_uses_the_signed_in_user_and_says_whose_token(jump_host_world):
    out = io.StringIO()
    code = doctor.run(jump_host_world.outputs, resolver=jump_host_world.resolve, out=out)  # its own credential
    text = out.getvalue()
    print(text)
    assert code == 0, text
    assert (
        "[  ok] sign-in: the token of user someone@example.com (object id 33333333-3333-3333-3333-333333333333, "
        "tenant 11111111-1111-1111-1111-111111111111), from AzureCliCredential"
    ) in text
    arm = [r for r in jump_host_world.fake.requests if "management.azure.com" in r.url]
    assert arm and {_claims_of(r.headers.get("Authorization"))["oid"] for r in arm} == {USER["oid"]}


def _submission(world, tmp_path, monkeypatch):
    made = {}
    monkeypatch.setattr("azure.ai.ml.MLClient", lambda cred, *a, **kw: made.setdefault("credential", cred))
    azureml.client(world.outputs)
    token = made["credential"].get_token("https://management.azure.com/.default").token
    return _claims_of("Bearer " + token)


def _quota_check(world, tmp_path, monkeypatch):
    world.fake.requests.clear()
    azureml.check_quota(world.outputs, "cpu-smoke", 1)
    arm = [r for r in world.fake.requests if "management.azure.com" in r.url]
    return {k: v for r in arm for k, v in _claims_of(r.headers.get("Authorization")).items()}


def _resume_from(world, tmp_path, monkeypatch):
    logs = world.outputs["datastores"]["logs"]
    listing = (
        b'<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs><Blob><Name>runs/a/checkpoints/'
        b"checkpoint-1.pt</Name><Properties><Content-Length>1</Content-Length><BlobType>BlockBlob</BlobType>"
        b"</Properties></Blob></Blobs><NextMarker /></EnumerationResults>"
    )
    world.fake.on(
        "GET",
        rf"{logs['account']}\.blob\.core\.windows\.net/{logs['container']}",
        (200, listing, {"Content-Type": "application/xml"}),
    )
    azure_authorizes_the_user_only(world.fake)
    assert checkpoints.check_folder(world.outputs, "runs/a/") == "runs/a/checkpoints/checkpoint-1.pt"
    blob = [r for r in world.fake.requests if ".blob.core." in r.url]
    return _claims_of(blob[-1].headers.get("Authorization"))


def _data_upload(world, tmp_path, monkeypatch):
    from datatools import transfer

    client = transfer.container_client("https://hvddevdataabc12345.blob.core.windows.net", "training-data")
    return _claims_of("Bearer " + client.credential.get_token("https://storage.azure.com/.default").token)


def _preflight(world, tmp_path, monkeypatch):
    world.fake.on(
        "GET",
        rf"management\.azure\.com/subscriptions/{SUB}",
        (200, {"id": f"/subscriptions/{SUB}", "subscriptionId": SUB, "state": "Enabled"}, {}),
    )
    world.fake.requests.clear()
    preflight.run(dev_stack(), current=(SUB, "$ARM_SUBSCRIPTION_ID"), out=io.StringIO())
    arm = [r for r in world.fake.requests if "management.azure.com" in r.url]
    return {k: v for r in arm for k, v in _claims_of(r.headers.get("Authorization")).items()}


@pytest.mark.parametrize(
    "tool", [_submission, _quota_check, _resume_from, _data_upload, _preflight], ids=lambda f: f.__name__[1:]
)
def test_every_tool_signs_in_as_the_person_on_the_jump_host(jump_host_world, tmp_path, monkeypatch, tool):
    claims = tool(jump_host_world, tmp_path, monkeypatch)
    assert claims.get("oid") == USER["oid"] and "xms_mirid" not in claims, claims


def test_the_vms_identity_when_asked_for_and_doctor_says_so(jump_host_world, monkeypatch):
    # azure-identity's own switch: AZURE_TOKEN_CREDENTIALS names one credential (or dev/prod), and the chain holds
    # only that one (azure.identity._internal.utils.process_credential_exclusions, 1.27.0).
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "ManagedIdentityCredential")
    made = _helper().azure_credential()
    assert [type(c).__name__ for c in made.credentials] == ["ManagedIdentityCredential"]
    out = io.StringIO()
    code = doctor.run(jump_host_world.outputs, resolver=jump_host_world.resolve, out=out)
    text = out.getvalue()
    assert code == 1, text  # Azure refuses the VM's identity: the workspace read is a 403
    assert (
        f"[WARN] sign-in: the token of managed identity {VM['xms_mirid']} (object id {VM['oid']}), from "
        "ManagedIdentityCredential"
    ) in text
    assert "AZURE_TOKEN_CREDENTIALS=ManagedIdentityCredential" in text and "unset AZURE_TOKEN_CREDENTIALS" in text
    assert "Azure refused it (403 AuthorizationFailed)" in text


def test_without_any_sign_in_the_fix_names_az_login_and_the_switch(monkeypatch, tmp_path, dev_outputs):
    fake = fake_arm.install(monkeypatch)
    for name in STEERING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no az
    fake.on("GET", r"169\.254\.169\.254/.*", (200, {}, {}))  # a machine with IMDS: still not asked
    out = io.StringIO()
    code = doctor.run(stack.load_file(dev_outputs), resolver=lambda host: ["10.40.16.5"], out=out)
    text = out.getvalue()
    assert code == 1 and "[FAIL] sign-in: asking Azure: not signed in to Azure" in text, text
    assert "az login" in text and "AZURE_TOKEN_CREDENTIALS=ManagedIdentityCredential" in text
    assert not [r for r in fake.requests if "169.254.169.254" in r.url], "the managed identity was not asked"


def test_the_credential_raises_azures_own_error_for_a_bad_switch(monkeypatch):
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "laptop")
    with pytest.raises(ValueError, match=re.escape("Invalid value for AZURE_TOKEN_CREDENTIALS: laptop")):
        _helper().azure_credential()


def test_a_service_principal_in_the_environment_is_still_used(monkeypatch):
    # CI signs in with AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET (EnvironmentCredential): kept, first.
    for name in STEERING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_CLIENT_ID", "77777777-7777-7777-7777-777777777777")
    monkeypatch.setenv("AZURE_TENANT_ID", "11111111-1111-1111-1111-111111111111")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "secret")
    names = [type(c).__name__ for c in _helper().azure_credential().credentials]
    assert names[0] == "EnvironmentCredential" and "ManagedIdentityCredential" not in names
    assert "AzureCliCredential" in names


def test_whose_token_is_described_from_its_claims():
    assert _helper().whose(USER) == (
        "user someone@example.com (object id 33333333-3333-3333-3333-333333333333, tenant "
        "11111111-1111-1111-1111-111111111111)"
    )
    assert _helper().whose(VM) == f"managed identity {VM['xms_mirid']} (object id {VM['oid']})"
    app = {"oid": "44444444-4444-4444-4444-444444444444", "idtyp": "app", "appid": "88888888-8888-8888-8888-8888888888"}
    assert _helper().whose(app) == (
        "service principal 88888888-8888-8888-8888-8888888888 (object id 44444444-4444-4444-4444-444444444444)"
    )


def test_the_refusal_is_the_sdks_own_error(jump_host_world):
    # What the VM's identity meets is azure-core's HttpResponseError with ARM's 403 body, as from the service.
    from azurecheck.arm import Arm

    outputs = jump_host_world.outputs
    with pytest.raises(HttpResponseError) as e:
        Arm(fake_arm.Credential(VM)).get(
            f"/subscriptions/{outputs['subscription_id']}/resourceGroups/{outputs['resource_group']}/providers/"
            f"Microsoft.MachineLearningServices/workspaces/{outputs['workspace_name']}",
            "2024-04-01",
        )
    assert e.value.status_code == 403 and e.value.error.code == "AuthorizationFailed"


def test_a_sign_in_refused_by_conditional_access_names_the_way_round_it(monkeypatch):
    """Issue 43, item 11: a tenant that blocks the device-code flow (the only `az login` on the jump host) answers
    AADSTS53003; preflight and doctor name it, with the way to submit from one's own machine through the tunnel."""
    from azure.core.exceptions import ClientAuthenticationError

    from azureaccess import credential
    from azurecheck import arm

    refused = ClientAuthenticationError(
        "AzureCliCredential.get_token failed: ERROR: AADSTS53003: Access has been blocked by Conditional Access "
        "policies. The access policy does not allow token issuance."
    )
    finding = arm.signed_out(refused)
    assert finding.status == arm.FAIL and "AADSTS53003" in finding.message
    assert "private-access.md#where-device-code-sign-in-is-blocked" in finding.fix
    plain = arm.signed_out(ClientAuthenticationError("Please run 'az login' to set up an account"))
    assert plain.fix == credential.SIGN_IN_FIX
    import urllib3.contrib.socks  # noqa: F401  requests' socks5h:// proxies (PySocks): the way through the tunnel
