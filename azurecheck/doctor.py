"""After `pulumi up`: can this person use the platform from here? Whose token the checks use (azureaccess/credential.py),
the workspace by name (privately when its public access is off), its datastores, a code-snapshot upload, every
job's image in the registry, and every cluster's quota; each failure with its fix. Exit status 1 when anything
fails."""

from __future__ import annotations

import os
import sys

from azure.core.exceptions import ClientAuthenticationError

from azureaccess import credential as signing_in
from azureaccess.stack import StackOutputs

from . import images, quota, roles, upload, workspace
from .arm import COMPUTE_API, Arm, attempt, signed_out
from .findings import FAIL, OK, WARN, Finding, report
from .preflight import quota_findings


def needs(outputs: StackOutputs) -> list[quota.Need]:
    return [
        quota.Need(name, c["vm_size"], int(c["max_nodes"]), bool(c.get("low_priority")))
        for name, c in sorted(outputs["clusters"].items())
    ]


def sign_in(credential) -> Finding:
    """Whose token every check below uses: Azure answers for that identity, which is the person's unless a
    managed identity was asked for (AZURE_TOKEN_CREDENTIALS) or handed in."""
    claims = roles.claims(credential)
    message = f"the token of {signing_in.whose(claims)}, from {signing_in.source(credential)}"
    if not claims.get("xms_mirid"):
        return Finding(OK, "sign-in", message)
    switch = os.environ.get(signing_in.SWITCH, "").strip()
    return Finding(
        WARN,
        "sign-in",
        message
        + ": the checks below answer for this machine's identity, not for you"
        + (f" ({signing_in.SWITCH}={switch})" if switch else ""),
        f"unset {signing_in.SWITCH} to use your own `az login`",
    )


def jump_host(arm: Arm, way_in: dict) -> list[Finding]:
    """The jump host's power state (Virtual Machines - Instance View: statuses[].code PowerState/...). Stopped (its
    evening auto-shutdown deallocates it), `pulumi destroy` and tag changes still work (wayin.py: its extensions go
    with it, tags stay off them), but Azure refuses to modify a stopped VM's extensions ("Cannot modify extensions
    in the VM when the VM is not running"): a `pulumi up` that changes their settings or replaces the VM fails."""
    vm_id = way_in.get("jump_host_id")
    if not vm_id:
        return []
    what = "jump host"
    view, failed = attempt(
        lambda: arm.get(f"{vm_id}/instanceView", COMPUTE_API),
        what,
        f"reading {vm_id}",
        "Bastion needs Reader on the VM too: the stack grants it to its `users`",
    )
    if failed:
        return failed
    power = next((s["code"] for s in view.get("statuses") or [] if s.get("code", "").startswith("PowerState/")), "")
    if power == "PowerState/running":
        return [Finding(OK, what, f"{way_in.get('jump_host', vm_id)} is running")]
    return [
        Finding(
            WARN,
            what,
            f"{way_in.get('jump_host', vm_id)} is {power.split('/')[-1] or 'in an unknown state'}: `pulumi destroy` and "
            "tag changes work, but a `pulumi up` that changes its extensions or replaces it fails until it runs "
            "(Azure modifies no extension of a stopped VM)",
            f"az vm start --ids {vm_id}, then pulumi up",
        )
    ]


def findings(
    outputs: StackOutputs, credential, transport=None, resolver=workspace.resolve, job_images=None
) -> list[Finding]:
    try:
        who = [sign_in(credential)]
    except ClientAuthenticationError as e:
        return [signed_out(e)]
    return who + _platform(outputs, credential, transport, resolver, job_images)


def _platform(outputs: StackOutputs, credential, transport, resolver, job_images) -> list[Finding]:
    arm = Arm(credential, transport)
    sub, ws_name = outputs["subscription_id"], outputs["workspace_name"]
    ws_id = workspace.resource_id(sub, outputs["resource_group"], ws_name)
    try:
        ws, failed = attempt(
            lambda: workspace.get(arm, ws_id),
            "workspace",
            f"reading workspace {ws_name}",
            "are the stack outputs this stack's (pulumi stack output --json), and are you on its "
            f"subscription {sub} (`az account show`)? You need a role on the workspace: `users`",
        )
        if failed:
            return failed
        found = workspace.check_dns(ws, resolver)
        project = {role: d["name"] for role, d in sorted(outputs["datastores"].items())}
        stores, blobstore = workspace.check_datastores(arm, ws_id, project)
        found += stores
        if blobstore and blobstore.get("accountName") and blobstore.get("containerName"):
            found += upload.check(blobstore["accountName"], blobstore["containerName"], credential, transport)
        else:
            found.append(
                Finding(
                    FAIL,
                    "code upload",
                    "not tried: workspaceblobstore is missing or unreadable",
                    "fix the datastore findings above",
                )
            )
        found += images.check(
            outputs["registry_login_server"],
            credential,
            images.job_images() if job_images is None else job_images,
            transport,
        )
        location = outputs.values.get("location") or ws.get("location")
        found += jump_host(arm, outputs.values.get("way_in") or {})
        return found + quota_findings(arm, sub, location, needs(outputs), workspace_id=ws_id)
    except ClientAuthenticationError as e:
        return [signed_out(e)]


def run(outputs: StackOutputs, credential=None, transport=None, resolver=workspace.resolve, out=sys.stdout) -> int:
    if credential is None:
        credential = signing_in.azure_credential()  # the person's sign-in, not this machine's identity
    print(
        f"doctor for workspace {outputs['workspace_name']} ({outputs['resource_group']}, subscription "
        f"{outputs['subscription_id']})",
        file=out,
    )
    return report(findings(outputs, credential, transport, resolver), out)
