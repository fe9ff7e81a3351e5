"""Azure Resource Manager reads, and Azure's errors as one readable line.

The ARM calls here are single documented GETs (usages, VM sizes, providers, permissions, role assignments and
definitions, subscription, workspace, datastores, the hub VNet and its private DNS zones). They go through azure-mgmt-core's ARMPipelineClient, the pipeline every generated
management SDK uses (bearer token for management.azure.com, retries, ARM error format), and raise
azure-core's exceptions as those SDKs do; this spares .venv three more management SDKs
(azure-mgmt-resource, -authorization, -machinelearningservices) for seven GETs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    map_error,
)
from azure.core.pipeline import policies
from azure.core.rest import HttpRequest
from azure.mgmt.core import ARMPipelineClient
from azure.mgmt.core.exceptions import ARMErrorFormat
from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy, ARMHttpLoggingPolicy

from azureaccess import errors
from azureaccess.credential import sign_in_fix

from .findings import FAIL, Finding

ENDPOINT = "https://management.azure.com"
SCOPE = ENDPOINT + "/.default"
# REST API versions, each the stable one whose documented response shape the parsers read.
ML_API = "2024-04-01"  # Microsoft.MachineLearningServices: usages, vmSizes, workspaces, datastores
PROVIDERS_API = "2021-04-01"  # Microsoft.Resources: providers
SUBSCRIPTIONS_API = "2022-12-01"  # Microsoft.Resources: subscriptions
PERMISSIONS_API = "2022-04-01"  # Microsoft.Authorization: permissions, role assignments, role definitions
NETWORK_API = "2024-05-01"  # Microsoft.Network: virtualNetworks (the hub VNet and its peerings)
PRIVATE_DNS_API = "2020-06-01"  # Microsoft.Network: privateDnsZones (the hub's central zones)
COMPUTE_API = "2024-07-01"  # Microsoft.Compute: virtualMachines/instanceView (the jump host's power state)
_ERRORS = {401: ClientAuthenticationError, 404: ResourceNotFoundError, 409: ResourceExistsError}


class Arm:
    """GETs against ARM with `credential` (azureaccess/credential.py in use; any azure-core TokenCredential)."""

    def __init__(self, credential, transport=None, endpoint: str = ENDPOINT):
        self._client = ARMPipelineClient(
            base_url=endpoint,
            transport=transport,
            policies=[
                policies.RequestIdPolicy(),
                policies.HeadersPolicy(),
                policies.UserAgentPolicy("azure-horovod-training-checks"),
                policies.RetryPolicy(),
                ARMChallengeAuthenticationPolicy(credential, SCOPE),
                policies.RedirectPolicy(),
                ARMHttpLoggingPolicy(),
            ],
        )

    def get(self, path: str, api_version: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        request = HttpRequest(
            "GET",
            self._client.format_url(path),
            params={"api-version": api_version, **(params or {})},
            headers={"Accept": "application/json"},
        )
        return self._send(request)

    def list(self, path: str, api_version: str, params: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """The `value` items of a list response, following `nextLink` pages."""
        page = self.get(path, api_version, params)
        while True:
            yield from page.get("value") or []
            link = page.get("nextLink")
            if not link:
                return
            page = self._send(HttpRequest("GET", link, headers={"Accept": "application/json"}))

    def _send(self, request: HttpRequest) -> dict[str, Any]:
        response = self._client.send_request(request)
        if response.status_code != 200:
            map_error(status_code=response.status_code, response=response, error_map=_ERRORS)
            raise HttpResponseError(response=response, error_format=ARMErrorFormat)
        return response.json() if response.content else {}


def error_code(error: HttpResponseError) -> str:
    """ARM's error.code, or a data-plane service's x-ms-error-code header."""
    code = getattr(error, "error_code", None) or getattr(getattr(error, "error", None), "code", None)
    if not code and error.response is not None:
        code = error.response.headers.get("x-ms-error-code")
    return str(getattr(code, "value", code) or "")


def first_line(text: object, limit: int = 240) -> str:
    return errors.first_line(text, limit)


def describe(error: Exception, doing: str) -> str:
    """`doing` ("listing quotas in westeurope") and why Azure said no, in one line."""
    if isinstance(error, ClientAuthenticationError):
        return f"{doing}: not signed in to Azure ({first_line(error.message)})"
    if isinstance(error, HttpResponseError):
        code, status = error_code(error), error.status_code
        message = first_line(error.message or str(error)).removeprefix(f"({code}) ")  # azure-core repeats the code
        if status == 403:
            return (
                f"{doing}: Azure refused it (403 {code or 'Forbidden'}): your identity lacks the permission"
                f"{': ' + message if message else ''}"
            )
        return f"{doing}: Azure answered {status} {code}: {message}"
    return f"{doing}: {first_line(error) or type(error).__name__}"


def signed_out(error: Exception) -> Finding:
    """The finding for a sign-in Azure refused, with the fix that fits why (credential.sign_in_fix)."""
    return Finding(FAIL, "sign-in", describe(error, "asking Azure"), sign_in_fix(error))


def attempt(call, check: str, doing: str, fix: str) -> tuple[Any, list[Finding]]:
    """(what `call()` answers, []) or (None, [the FAIL finding of `check`: `doing` and why Azure said no, and `fix`]);
    a refused sign-in goes on up to the caller's one sign-in finding (signed_out)."""
    try:
        return call(), []
    except ClientAuthenticationError:
        raise
    except AzureError as e:
        return None, [Finding(FAIL, check, describe(e, doing), fix)]
