"""Azure at the network boundary for azurecheck's checks (and the launcher's submission-time quota check): every azure-core pipeline (ARM, blob storage,
container registry) sends through requests' HTTPAdapter, which the `fake` fixture replaces with routes
answering recorded-shaped JSON (the REST reference's documented examples) or Azure's error bodies."""

from __future__ import annotations

import base64
import io
import json
import re
import time
import uuid

import requests
import urllib3
from requests.adapters import HTTPAdapter


def jwt(claims: dict) -> str:
    """An unsigned JWT with these claims (the checks read their own token's claims; they never verify it)."""

    def part(d):
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.sig"


USER = {
    "oid": "33333333-3333-3333-3333-333333333333",
    "idtyp": "user",
    "scp": "user_impersonation",
    "upn": "someone@example.com",
}
SERVICE_PRINCIPAL = {"oid": "44444444-4444-4444-4444-444444444444", "idtyp": "app", "roles": []}


class Credential:
    """What DefaultAzureCredential hands azure-core: an access token, here for the given claims."""

    def __init__(self, claims: dict | None = None, error: Exception | None = None):
        self.claims, self.error = claims or USER, error

    def get_token(self, *scopes, **kw):
        from azure.core.credentials import AccessToken

        if self.error:
            raise self.error
        return AccessToken(jwt(self.claims), int(time.time()) + 3600)

    def get_token_info(self, *scopes, **kw):
        from azure.core.credentials import AccessTokenInfo

        if self.error:
            raise self.error
        return AccessTokenInfo(jwt(self.claims), int(time.time()) + 3600)


def arm_error(status: int, code: str, message: str):
    return status, {"error": {"code": code, "message": message}}, {}


class FakeAzure:
    def __init__(self):
        # (method, regex on host+path) -> (status, body, headers) or a callable(request, match) returning it
        self.routes: list[tuple[str, re.Pattern, object]] = []
        self.requests: list[requests.PreparedRequest] = []

    def on(self, method: str, pattern: str, answer) -> None:
        """Later routes win, so a test can replace one answer of a working fake."""
        self.routes.insert(0, (method, re.compile(pattern), answer))

    def __call__(self, request: requests.PreparedRequest) -> requests.Response:
        self.requests.append(request)
        url = urllib3.util.parse_url(request.url)
        target = f"{url.host}{url.path}"
        for method, pattern, answer in self.routes:
            m = pattern.fullmatch(target)
            if m and method == request.method:
                status, body, headers = answer(request, m) if callable(answer) else answer
                return self.response(request, status, body, headers)
        return self.response(
            request, 404, {"error": {"code": "NotFound", "message": f"fake Azure has no {target}"}}, {}
        )

    @staticmethod
    def response(request, status: int, body, headers: dict) -> requests.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
        headers = {
            "Content-Length": str(len(data)),
            "x-ms-request-id": "fake",
            **({"Content-Type": "application/json"} if not isinstance(body, bytes) and body is not None else {}),
            **headers,
        }
        raw = urllib3.HTTPResponse(
            body=io.BytesIO(data), headers=headers, status=status, preload_content=False, reason="fake"
        )
        return HTTPAdapter().build_response(request, raw)


def install(monkeypatch) -> FakeAzure:
    fake = FakeAzure()
    monkeypatch.setattr(HTTPAdapter, "send", lambda self, request, **kw: fake(request))
    return fake


# ---- documented shapes of the data planes the cost ledger reads (launcher/cost) ----------------------------


def rfc1123(when) -> str:
    """An HTTP date as Azure Storage writes Last-Modified: 'Fri, 20 Nov 2026 09:36:40 GMT'."""
    return when.strftime("%a, %d %b %Y %H:%M:%S GMT")


def list_blobs_xml(account: str, container: str, prefix: str, blobs: list[dict]) -> bytes:
    """A "List Blobs" answer (learn.microsoft.com/rest/api/storageservices/list-blobs): each blob a dict of name,
    last_modified (datetime), size, and with include=versions its version_id and current (IsCurrentVersion)."""
    items = []
    for b in blobs:
        version = (
            f"<VersionId>{b['version_id']}</VersionId>"
            + ("<IsCurrentVersion>true</IsCurrentVersion>" if b.get("current") else "")
            if b.get("version_id")
            else ""
        )
        items.append(
            f"<Blob><Name>{b['name']}</Name>{version}<Properties>"
            f"<Creation-Time>{rfc1123(b['last_modified'])}</Creation-Time>"
            f"<Last-Modified>{rfc1123(b['last_modified'])}</Last-Modified><Etag>0x8DD{len(items):05d}</Etag>"
            f"<Content-Length>{b.get('size', 0)}</Content-Length><Content-Type>application/octet-stream</Content-Type>"
            "<BlobType>BlockBlob</BlobType><LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState>"
            "</Properties></Blob>"
        )
    return (
        '<?xml version="1.0" encoding="utf-8"?>'
        f'<EnumerationResults ServiceEndpoint="https://{account}.blob.core.windows.net/" ContainerName="{container}">'
        f"<Prefix>{prefix}</Prefix><Blobs>{''.join(items)}</Blobs><NextMarker /></EnumerationResults>"
    ).encode()


def blob_content(data: bytes, last_modified) -> tuple[int, bytes, dict]:
    """A "Get Blob" answer to the ranged first GET azure-storage-blob sends (206, Content-Range)."""
    return (
        206,
        data,
        {
            "Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}",
            "Last-Modified": rfc1123(last_modified),
            "ETag": '"0x8DD00000"',
            "x-ms-blob-type": "BlockBlob",
            "Content-Type": "application/octet-stream",
        },
    )


def storage_error(status: int, code: str, message: str) -> tuple[int, bytes, dict]:
    """Azure Storage's error: XML body and the x-ms-error-code header
    (learn.microsoft.com/rest/api/storageservices/blob-service-error-codes)."""
    xml = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}\n'
        "RequestId:0\nTime:2026-11-20T12:00:00Z</Message></Error>"
    )
    return status, xml.encode(), {"x-ms-error-code": code, "Content-Type": "application/xml"}


def log_analytics(columns: list[tuple[str, str]], rows: list[list]) -> tuple[int, dict, dict]:
    """A Log Analytics query answer (learn.microsoft.com/azure/azure-monitor/logs/api/response-format)."""
    return (
        200,
        {"tables": [{"name": "PrimaryResult", "columns": [{"name": n, "type": t} for n, t in columns], "rows": rows}]},
        {},
    )


# ---- documented shapes of the ARM reads preflight makes on permissions, role assignments and a hub VNet --------


def permissions(actions, not_actions=()) -> dict:
    """Permissions - List For Resource Group / List For Resource (Microsoft.Authorization 2022-04-01): a list of
    Permission, each "actions", "notActions", "dataActions", "notDataActions" and nothing else (no condition)."""
    return {
        "value": [{"actions": list(actions), "notActions": list(not_actions), "dataActions": [], "notDataActions": []}]
    }


def role_assignment(scope: str, role_guid: str, principal_id: str, condition: str | None = None) -> dict:
    """One item of Role Assignments - List For Scope (2022-04-01; its example's fields), with the documented
    `condition` and `conditionVersion` ("Currently the only accepted value is '2.0'") when it has one."""
    name = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scope}|{role_guid}|{principal_id}"))
    sub = scope.split("/")[2]
    props = {
        "roleDefinitionId": f"/subscriptions/{sub}/providers/Microsoft.Authorization/roleDefinitions/{role_guid}",
        "principalId": principal_id,
        "principalType": "User",
        "scope": scope,
    }
    if condition:
        props |= {"condition": condition, "conditionVersion": "2.0"}
    return {
        "properties": props,
        "id": f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}",
        "type": "Microsoft.Authorization/roleAssignments",
        "name": name,
    }


def role_definition(subscription: str, role_guid: str, role_name: str, actions, not_actions=()) -> dict:
    """Role Definitions - Get By Id (2022-04-01): properties.roleName, properties.permissions (Permission list)."""
    return {
        "id": f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/{role_guid}",
        "name": role_guid,
        "type": "Microsoft.Authorization/roleDefinitions",
        "properties": {
            "roleName": role_name,
            "type": "BuiltInRole",
            "permissions": permissions(actions, not_actions)["value"],
            "assignableScopes": ["/"],
        },
    }


def vnet_peering(vnet_id: str, name: str, remote_id: str, remote_prefixes, state: str = "Connected") -> dict:
    """A VirtualNetworkPeering as Virtual Network Peerings - Get/List (Microsoft.Network 2024-05-01) show it, and
    as Virtual Networks - Get embeds it in properties.virtualNetworkPeerings."""
    return {
        "name": name,
        "id": f"{vnet_id}/virtualNetworkPeerings/{name}",
        "properties": {
            "allowVirtualNetworkAccess": True,
            "allowForwardedTraffic": True,
            "allowGatewayTransit": False,
            "useRemoteGateways": False,
            "remoteVirtualNetwork": {"id": remote_id},
            "remoteAddressSpace": {"addressPrefixes": list(remote_prefixes)},
            "remoteVirtualNetworkAddressSpace": {"addressPrefixes": list(remote_prefixes)},
            "peeringState": state,
            "peeringSyncLevel": "FullyInSync",
            "provisioningState": "Succeeded",
        },
    }


def virtual_network(vnet_id: str, prefixes, peerings=()) -> dict:
    """Virtual Networks - Get (Microsoft.Network 2024-05-01): properties.addressSpace.addressPrefixes and
    properties.virtualNetworkPeerings."""
    return {
        "name": vnet_id.rsplit("/", 1)[-1],
        "id": vnet_id,
        "type": "Microsoft.Network/virtualNetworks",
        "location": "westeurope",
        "properties": {
            "provisioningState": "Succeeded",
            "addressSpace": {"addressPrefixes": list(prefixes)},
            "subnets": [],
            "virtualNetworkPeerings": list(peerings),
            "enableDdosProtection": False,
        },
    }


def private_zone(zone_id: str) -> dict:
    """Private Zones - Get (Microsoft.Network privateDnsZones, 2020-06-01)."""
    return {
        "id": zone_id,
        "name": zone_id.rsplit("/", 1)[-1],
        "type": "Microsoft.Network/privateDnsZones",
        "etag": "00000000-0000-0000-0000-000000000000",
        "location": "global",
        "tags": {},
        "properties": {
            "maxNumberOfRecordSets": 25000,
            "maxNumberOfVirtualNetworkLinks": 1000,
            "maxNumberOfVirtualNetworkLinksWithRegistration": 100,
            "numberOfRecordSets": 1,
            "numberOfVirtualNetworkLinks": 1,
            "numberOfVirtualNetworkLinksWithRegistration": 0,
            "provisioningState": "Succeeded",
        },
    }
