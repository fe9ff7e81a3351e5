"""Can this identity upload a code snapshot? A small blob written to and deleted from workspaceblobstore's
container, with the same credential azure-ai-ml uses for the snapshot (identity-based datastores, shared
keys off: the user's own token). Status codes: learn.microsoft.com/rest/api/storageservices/blob-service-error-codes.
"""

from __future__ import annotations

import uuid

from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError, ServiceRequestError

from .arm import describe, error_code
from .findings import FAIL, OK, WARN, Finding

PROBE_PREFIX = "azure-horovod-training-doctor"

ROLE_FIX = (
    "the stack grants 'Storage Blob Data Contributor' on the workspace storage to everyone in `users`: list "
    "yourself (or your group) there and run pulumi up; or az role assignment create --role "
    "'Storage Blob Data Contributor' --assignee <you> --scope <storage account id>"
)
FIREWALL_FIX = (
    "its firewall admits network.allowedClientIps only: add this machine's public IPv4 (`curl -4 "
    "ifconfig.me`) there in Pulumi.<stack>.yaml and run pulumi up, or submit from inside the VNet"
)


def check(account: str, container: str, credential, transport=None) -> list[Finding]:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient(
        f"https://{account}.blob.core.windows.net",
        credential=credential,
        **({"transport": transport} if transport else {}),
    )
    blob = service.get_blob_client(container, f"{PROBE_PREFIX}/{uuid.uuid4()}.txt")
    check_name = "code upload"
    try:
        blob.upload_blob(b"written and deleted by doctor (python -m azurecheck doctor)\n")
    except ClientAuthenticationError as e:
        return [Finding(FAIL, check_name, describe(e, f"writing to {account}/{container}"), ROLE_FIX)]
    except HttpResponseError as e:
        code = error_code(e)
        if e.status_code == 403 and code in ("AuthorizationFailure", "AuthorizationSourceIPMismatch"):
            return [
                Finding(FAIL, check_name, f"{account} refused the write from this network (403 {code})", FIREWALL_FIX)
            ]
        if e.status_code == 403:
            return [
                Finding(
                    FAIL,
                    check_name,
                    f"{account} refused the write (403 {code or 'Forbidden'}): you have no "
                    "data role on it (Azure roles like Owner or AzureML Data Scientist carry none)",
                    ROLE_FIX,
                )
            ]
        return [Finding(FAIL, check_name, describe(e, f"writing to {account}/{container}"), "")]
    except ServiceRequestError as e:
        return [
            Finding(
                FAIL,
                check_name,
                f"cannot reach {account}.blob.core.windows.net ({e}): with public access "
                "off the workspace storage answers only through its private endpoint",
                "work from inside the VNet, or set workspacePublicAccess: true",
            )
        ]
    try:
        blob.delete_blob()
    except AzureError as e:
        return [
            Finding(
                WARN,
                check_name,
                f"uploaded to {account}/{container}, but deleting the probe failed ({describe(e, 'deleting')})",
                f"delete {PROBE_PREFIX}/ in that container by hand",
            )
        ]
    return [Finding(OK, check_name, f"wrote and deleted a probe blob in {account}/{container}")]
