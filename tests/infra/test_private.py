"""Private endpoints and their DNS: what Azure needs for a service with public access off to be reachable.

Azure's rules these tests hold the program to (https://learn.microsoft.com/azure/private-link/private-endpoint-dns):
- an endpoint resolves privately only when its zone (the documented name for its group id) is linked to the VNet
  and the endpoint's DNS zone group points at that zone;
- a VNet resolves a zone name through one linked zone: endpoints needing the same zone share it.
"""
import pulumi
import pytest
from pulumi.runtime.sync_await import _sync_await
from pulumi.runtime.stack import run_pulumi_func

from trainingplatform import mocked, privatelink


def _run(body):
    mocks = mocked.RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="test", stack="test", preview=False)
    with mocked.recording_options(mocks):
        _sync_await(run_pulumi_func(body))
    return mocks


def _of(mocks, suffix):
    return [r for r in mocks.resources if r.type.endswith(suffix)]


def test_two_endpoints_needing_the_same_zone_share_it():
    def body():
        dns = privatelink.PrivateDnsZones("dns", "rg", "/vnet", {})
        privatelink.PrivateLink("data", "rg", "westeurope", "/acct/data", "blob", "/subnet", dns, {})
        privatelink.PrivateLink("logs", "rg", "westeurope", "/acct/logs", "blob", "/subnet", dns, {})
        privatelink.PrivateLink("nfs", "rg", "westeurope", "/acct/nfs", "file", "/subnet", dns, {})

    mocks = _run(body)
    zones = sorted(r.inputs["privateZoneName"] for r in _of(mocks, "PrivateZone"))
    assert zones == ["privatelink.blob.core.windows.net", "privatelink.file.core.windows.net"]
    links = _of(mocks, "VirtualNetworkLink")
    assert len(links) == 2 and all(l.inputs["virtualNetwork"]["id"] == "/vnet" for l in links)
    assert all(l.inputs["registrationEnabled"] is False for l in links)
    blob_zone = next(r.id for r in _of(mocks, "PrivateZone") if r.inputs["privateZoneName"].startswith("privatelink.blob"))
    groups = {r.name: r.inputs for r in _of(mocks, "PrivateDnsZoneGroup")}
    for name in ("data", "logs"):
        assert [c["privateDnsZoneId"] for c in groups[f"{name}-zone-group"]["privateDnsZoneConfigs"]] == [blob_zone]
    endpoints = {r.name: r.inputs for r in _of(mocks, "PrivateEndpoint")}
    conn = endpoints["logs-endpoint"]["privateLinkServiceConnections"][0]
    assert conn["privateLinkServiceId"] == "/acct/logs" and conn["groupIds"] == ["blob"]
    assert endpoints["logs-endpoint"]["subnet"]["id"] == "/subnet"


def test_workspace_endpoint_registers_in_both_azure_ml_zones():
    # Azure ML needs both zones: api.azureml.ms (workspace API, what compute talks to) and
    # notebooks.azure.net (studio); https://learn.microsoft.com/azure/machine-learning/how-to-custom-dns
    def body():
        dns = privatelink.PrivateDnsZones("dns", "rg", "/vnet", {})
        privatelink.PrivateLink("ws", "rg", "westeurope", "/ws", "amlworkspace", "/subnet", dns, {})

    mocks = _run(body)
    zone_ids = {r.id: r.inputs["privateZoneName"] for r in _of(mocks, "PrivateZone")}
    group = _of(mocks, "PrivateDnsZoneGroup")[0].inputs
    assert sorted(zone_ids[c["privateDnsZoneId"]] for c in group["privateDnsZoneConfigs"]) == [
        "privatelink.api.azureml.ms", "privatelink.notebooks.azure.net"]


def test_zone_group_waits_for_the_vnet_links():
    def body():
        dns = privatelink.PrivateDnsZones("dns", "rg", "/vnet", {})
        privatelink.PrivateLink("acr", "rg", "westeurope", "/acr", "registry", "/subnet", dns, {})

    mocks = _run(body)
    assert mocks.depends_on("acr-zone-group") >= {"dns-privatelink-azurecr-io-link"}


def test_unknown_group_id_names_the_fix():
    def body():
        dns = privatelink.PrivateDnsZones("dns", "rg", "/vnet", {})
        privatelink.PrivateLink("x", "rg", "westeurope", "/x", "sqlServer", "/subnet", dns, {})

    with pytest.raises(ValueError, match="no private DNS zone known for group id 'sqlServer': pass zone_names"):
        _run(body)
