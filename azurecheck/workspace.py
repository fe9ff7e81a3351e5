"""The deployed workspace: reachable by name (privately when public access is off), and its datastores.

FQDN: `<workspace GUID>.workspace.<region>.api.azureml.ms` (learn.microsoft.com/azure/machine-learning/
how-to-custom-dns, "Workspace DNS resolution path"); with public access off it must resolve to the private
endpoint's address in the VNet. Default datastores (learn.microsoft.com/azure/machine-learning/concept-data):
workspaceblobstore (code snapshots, uploads), workspaceworkingdirectory, workspacefilestore,
workspaceartifactstore; the stack adds its data and logs datastores (workspace.py).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from azure.core.exceptions import AzureError, ClientAuthenticationError, ResourceNotFoundError

from .arm import ML_API, Arm, describe
from .findings import FAIL, OK, WARN, Finding

# workspaceblobstore carries every job's code snapshot: without it nothing is submitted.
DEFAULT_DATASTORES = {
    "workspaceblobstore": FAIL,
    "workspaceartifactstore": WARN,
    "workspacefilestore": WARN,
    "workspaceworkingdirectory": WARN,
}
WAY_IN = (
    "work from inside the VNet (a VM or Azure Bastion in it, or a VPN/ExpressRoute gateway to it) with DNS "
    "that answers from the stack's private zones (privatelink.api.azureml.ms, privatelink.notebooks.azure.net: "
    "Azure's resolver 168.63.129.16, or a DNS Private Resolver/forwarder to it for on-premises clients); or set "
    "workspacePublicAccess: true in Pulumi.<stack>.yaml and run pulumi up"
)


def resource_id(subscription: str, resource_group: str, workspace: str) -> str:
    return (
        f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/"
        "Microsoft.MachineLearningServices/workspaces/" + workspace
    )


def get(arm: Arm, ws_id: str) -> dict:
    return arm.get(ws_id, ML_API)


def resolve(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, 443, proto=socket.IPPROTO_TCP)})


def check_dns(ws: dict, resolver: Callable[[str], list[str]] = resolve) -> list[Finding]:
    props = ws.get("properties") or {}
    private = str(props.get("publicNetworkAccess", "Enabled")).lower() == "disabled"
    host = f"{props.get('workspaceId')}.workspace.{ws.get('location')}.api.azureml.ms"
    try:
        addresses = resolver(host)
    except OSError as e:
        if private:
            return [
                Finding(
                    FAIL,
                    "workspace DNS",
                    f"{host} does not resolve here ({e}); the workspace has public "
                    "access off, so only its private endpoint answers",
                    WAY_IN,
                )
            ]
        return [
            Finding(
                FAIL,
                "workspace DNS",
                f"{host} does not resolve here ({e})",
                "check this machine's DNS and internet access",
            )
        ]
    public = [a for a in addresses if not ipaddress.ip_address(a).is_private]
    if private and (public or not addresses):
        return [
            Finding(
                FAIL,
                "workspace DNS",
                f"{host} resolves to {', '.join(addresses) or 'nothing'} here, not to "
                "the private endpoint: the workspace has public access off, so requests from here are refused",
                WAY_IN,
            )
        ]
    kind = "private endpoint" if not public else "public address; public access is on"
    return [Finding(OK, "workspace DNS", f"{host} -> {', '.join(addresses)} ({kind})")]


def check_datastores(arm: Arm, ws_id: str, project: dict[str, str]) -> tuple[list[Finding], dict | None]:
    """(findings, workspaceblobstore's properties or None). project: role -> datastore name (stack outputs)."""
    findings, blobstore = [], None
    wanted = {
        **{n: (s, "default") for n, s in DEFAULT_DATASTORES.items()},
        **{n: (FAIL, f"the stack's {role}") for role, n in project.items()},
    }
    for name, (severity, kind) in wanted.items():
        try:
            found = arm.get(f"{ws_id}/datastores/{name}", ML_API)
        except ResourceNotFoundError:
            fix = (
                "run pulumi up (the stack declares it; infra/trainingplatform/workspace.py)"
                if kind != "default"
                else "Azure ML creates it with the workspace: `az ml datastore list -w <workspace> -g <group>`; a "
                "workspace created halfway needs pulumi up again (or destroy and up)"
            )
            findings.append(Finding(severity, f"datastore {name}", f"{kind} datastore missing", fix))
            continue
        except ClientAuthenticationError:
            raise
        except AzureError as e:
            findings.append(
                Finding(
                    FAIL,
                    f"datastore {name}",
                    describe(e, "reading it"),
                    "you need AzureML Data Scientist (or Reader) on the workspace: list yourself "
                    "in `users` and run pulumi up",
                )
            )
            continue
        props = found.get("properties") or {}
        if name == "workspaceblobstore":
            blobstore = props
        where = "/".join(str(props[k]) for k in ("accountName", "containerName") if props.get(k))
        findings.append(
            Finding(OK, f"datastore {name}", f"{kind} datastore present ({where or props.get('datastoreType')})")
        )
    return findings, blobstore
