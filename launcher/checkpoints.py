"""--resume-from a folder: the folder must hold checkpoints, or the payload would silently start at epoch 0.

The check lists the logs container (the account and container the stack outputs name) with the user's
Entra login, the access the data stack grants its users (Storage Blob Data Reader on the logs container).
"""

from __future__ import annotations

from azureaccess.errors import JobError
from azureaccess.stack import StackOutputs


def check_folder(outputs: StackOutputs, folder: str, credential=None) -> str:
    """The first checkpoint blob under `folder`checkpoints/ in the logs container; JobError if none or unreadable."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
    )

    from azureaccess.credential import azure_credential

    logs = outputs["datastores"]["logs"]
    account, container = logs.get("account"), logs.get("container")
    if not account or not container:
        raise JobError(
            "--resume-from a folder needs datastores.logs.account and .container in the stack outputs: "
            "the stack is older than this tool; run pulumi up and write the outputs again"
        )
    prefix = folder + "checkpoints/"
    where = f"{container}/{prefix} of storage account {account}"
    client = outputs.blob_container("logs", credential or azure_credential())
    try:
        first = next(iter(client.list_blobs(name_starts_with=prefix, results_per_page=1)), None)
    except ResourceNotFoundError:
        raise JobError(
            f"--resume-from {folder}: the logs container {container} does not exist in {account}: check "
            "the stack outputs file"
        ) from None
    except (ClientAuthenticationError, HttpResponseError) as e:
        status = getattr(e, "status_code", None)
        raise JobError(
            f"--resume-from {folder}: cannot list {where} ({status or type(e).__name__}: "
            f"{str(e).splitlines()[0]}). Reading it needs Storage Blob Data Reader on the logs container "
            "(the data stack's `users` get it) and a network way in (the data stack's allowedClientIps or "
            "allowedSubnetIds, or a machine in the platform's VNet)"
        ) from None
    except ServiceRequestError as e:
        raise JobError(f"--resume-from {folder}: cannot reach {account}.blob.core.windows.net ({e})") from None
    if first is None:
        raise JobError(
            f"--resume-from {folder}: no checkpoint under {where}; the job would start from epoch 0. List "
            f"the runs: az storage blob list --auth-mode login --account-name {account} -c {container} "
            "--prefix runs/ --delimiter / -o table"
        )
    return first.name
