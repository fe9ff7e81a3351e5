"""Private endpoints and their DNS: what Azure needs for a service with public access off to be reachable.

Azure's rules these tests hold the program to (https://learn.microsoft.com/azure/private-link/private-endpoint-dns):
- an endpoint resolves privately only when its zone (the documented name for its group id) is linked to the VNet
  and the endpoint's DNS zone group points at that zone;
- a VNet resolves a zone name through one linked zone: endpoints needing the same zone share it.
"""

import copy

import pulumi
import pytest
from infra_helpers import PROD_FILE, ROOT, one
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from trainingplatform import compute as compute_module
from trainingplatform import mocked, privatelink, review


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
    assert len(links) == 2 and all(link.inputs["virtualNetwork"]["id"] == "/vnet" for link in links)
    assert all(link.inputs["registrationEnabled"] is False for link in links)
    blob_zone = next(
        r.id for r in _of(mocks, "PrivateZone") if r.inputs["privateZoneName"].startswith("privatelink.blob")
    )
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
        "privatelink.api.azureml.ms",
        "privatelink.notebooks.azure.net",
    ]


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


# ---- the platform under mocks: dev (public workspace) and prod (the fully private profile) ----

AML_ZONES = {"privatelink.api.azureml.ms", "privatelink.notebooks.azure.net"}


def _endpoints_to(mocks, target_id):
    return [
        r
        for r in mocks.of_type("network:PrivateEndpoint")
        if any(c["privateLinkServiceId"] == target_id for c in r.inputs["privateLinkServiceConnections"])
    ]


def _zones_of(mocks, endpoint):
    """Names of the private DNS zones an endpoint's zone group registers it in (each zone linked to the VNet)."""
    vnet = one(mocks, "VirtualNetwork", "net-vnet").id
    linked = {
        r.inputs["privateZoneName"]
        for r in mocks.of_type("VirtualNetworkLink")
        if r.inputs["virtualNetwork"]["id"] == vnet
    }
    zone_names = {r.id: r.inputs["privateZoneName"] for r in mocks.of_type("PrivateZone")}
    groups = [g for g in mocks.of_type("PrivateDnsZoneGroup") if g.inputs["privateEndpointName"] == endpoint.name]
    assert len(groups) == 1, endpoint.name
    names = {zone_names[c["privateDnsZoneId"]] for c in groups[0].inputs["privateDnsZoneConfigs"]}
    assert names <= linked, f"zones not linked to the VNet: {names - linked}"
    return names, groups[0]


def _private_link_of(mocks, target, group_id):
    """(endpoint, zone names, zone group) of the one endpoint to `target`'s `group_id`."""
    found = [
        e
        for e in _endpoints_to(mocks, target.id)
        if e.inputs["privateLinkServiceConnections"][0]["groupIds"] == [group_id]
    ]
    assert len(found) == 1, (target.name, group_id, [e.name for e in _endpoints_to(mocks, target.id)])
    assert found[0].inputs["subnet"]["id"] == one(mocks, "Subnet", "net-endpoints").id
    return (found[0], *_zones_of(mocks, found[0]))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_workspace_endpoint_exists_and_every_cluster_waits_for_it(dev, prod, stack):
    mocks, _ = dev if stack == "dev" else prod
    ws = one(mocks, "machinelearningservices:Workspace", "ml-workspace")
    endpoint, zones, zone_group = _private_link_of(mocks, ws, "amlworkspace")
    assert zones == AML_ZONES
    clusters = mocks.of_type("machinelearningservices:Compute")
    assert clusters
    for c in clusters:
        assert c.inputs["properties"]["properties"]["enableNodePublicIp"] is False
        assert {endpoint.name, zone_group.name} <= mocks.depends_on(c.name), c.name


def test_clusters_wait_for_their_acrpull_grant(dev):
    mocks, _ = dev
    identity = one(mocks, "UserAssignedIdentity", "compute-identity")
    acr = one(mocks, "Registry", "registry-acr")
    grant = [
        r
        for r in mocks.of_type("RoleAssignment")
        if r.inputs["principalId"] == "principal-compute-identity"  # the mocks' principal id of that identity
        and r.inputs["scope"] == acr.id
        and r.inputs["roleDefinitionId"].endswith("7f951dda-4ed3-4680-a7ca-43fe172d538d")
    ]
    assert len(grant) == 1
    for c in mocks.of_type("machinelearningservices:Compute"):
        assert grant[0].name in mocks.depends_on(c.name)
        # the cluster runs as that identity
        assert c.inputs["identity"]["userAssignedIdentities"] == [identity.id]


def test_clusters_are_replaced_when_azure_ml_would_ignore_the_change(dev):
    # Each path must name a property the cluster actually declares, or Pulumi would silently never replace.
    mocks, _ = dev
    for c in mocks.of_type("machinelearningservices:Compute"):
        opts = mocks.options[c.name]
        assert not opts.delete_before_replace  # a new name: the new cluster is created beside the old one
        assert sorted(opts.replace_on_changes) == sorted(compute_module.REPLACE_ON_CHANGES)
        for path in opts.replace_on_changes:
            value = c.inputs
            for key in path.split("."):
                assert isinstance(value, dict) and key in value, (c.name, path)
                value = value[key]
    # The identity is updated in place (tests/infra/test_replacements.py).
    assert {p.rsplit(".", 1)[-1] for p in compute_module.REPLACE_ON_CHANGES} == {
        "computeName",
        "vmSize",
        "vmPriority",
        "subnet",
        "enableNodePublicIp",
    }


def test_ssh_is_never_a_public_port(dev_raw):
    raw, location = copy.deepcopy(dev_raw)
    raw["clusters"][1]["sshEnabled"] = True
    raw["sshPublicKey"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample user@laptop"
    mocks, _ = mocked.run(raw, "dev", location)
    props = one(mocks, "Compute", "compute-gpu-ib").inputs["properties"]["properties"]
    assert props["enableNodePublicIp"] is False
    assert props["remoteLoginPortPublicAccess"] == "Disabled"  # there is no public IP to open a port on
    assert props["userAccountCredentials"]["adminUserSshPublicKey"].startswith("ssh-ed25519 ")


def test_fully_private_profile(prod):
    mocks, outputs = prod
    acr = one(mocks, "Registry", "registry-acr")
    vault = one(mocks, "Vault", "ml-kv")
    ws = one(mocks, "machinelearningservices:Workspace", "ml-workspace")
    ws_storage = one(mocks, "StorageAccount", "ml-storage")
    assert acr.inputs["publicNetworkAccess"] == "Disabled"
    assert vault.inputs["properties"]["publicNetworkAccess"] == "Disabled"
    assert ws.inputs["publicNetworkAccess"] == "Disabled"
    assert ws_storage.inputs["publicNetworkAccess"] == "Disabled"
    # Each private service is reachable through an endpoint registered in Azure's zone for it.
    expected = [
        (acr, "registry", {"privatelink.azurecr.io"}),
        (vault, "vault", {"privatelink.vaultcore.azure.net"}),
        (ws, "amlworkspace", AML_ZONES),
        (ws_storage, "blob", {"privatelink.blob.core.windows.net"}),
        (ws_storage, "file", {"privatelink.file.core.windows.net"}),
    ]
    for target, group_id, zones in expected:
        _, names, _ = _private_link_of(mocks, target, group_id)
        assert names == zones, (target.name, group_id)
    # One zone per name: the workspace storage's file endpoint shares the NFS share's zone.
    zone_names = [r.inputs["privateZoneName"] for r in mocks.of_type("PrivateZone")]
    assert len(zone_names) == len(set(zone_names))
    nfs_zones, _ = _zones_of(mocks, one(mocks, "PrivateEndpoint", "nfs-endpoint"))
    assert nfs_zones == {"privatelink.file.core.windows.net"}
    # The workspace waits for its dependencies' endpoints (as 201-machine-learning-moderately-secure does).
    waits = mocks.depends_on("ml-workspace")
    for target, group_id, _ in expected:
        if target is not ws:
            endpoint, _, _ = _private_link_of(mocks, target, group_id)
            assert endpoint.name in waits, (target.name, group_id)
    assert outputs["registry_login_server"].endswith(".azurecr.io")


@pytest.mark.parametrize(
    "setting,target_type,target_name,group_id",
    [
        ("registryPublicAccess", "Registry", "registry-acr", "registry"),
        ("keyVaultPublicAccess", "Vault", "ml-kv", "vault"),
        ("workspacePublicAccess", "StorageAccount", "ml-storage", "blob"),
    ],
)
def test_each_private_setting_brings_its_endpoint(dev, dev_raw, setting, target_type, target_name, group_id):
    public_mocks, _ = dev
    assert _endpoints_to(public_mocks, one(public_mocks, target_type, target_name).id) == []
    raw, location = copy.deepcopy(dev_raw)
    raw[setting] = False
    if setting == "workspacePublicAccess":  # a private workspace needs a way in (config.py, test_wayin.py)
        raw["access"] = {
            "mode": "bastion",
            "bastionSubnetCidr": "10.40.17.0/26",
            "jumpHostSubnetCidr": "10.40.17.64/28",
        }
    mocks, _ = mocked.run(raw, "dev", location)
    _private_link_of(mocks, one(mocks, target_type, target_name), group_id)


def test_committed_prod_review_is_current():
    assert review.render(PROD_FILE) == (ROOT / "infra" / "review" / "prod.txt").read_text(), (
        "infra/review/prod.txt is out of date: run scripts/review-infra prod and commit the result"
    )
