"""Each class of bad stack config fails with the key, the value and what is allowed; nothing is declared."""

import copy

import pytest
from infra_helpers import DEV_FILE, one

from trainingplatform import config, mocked


def bad(dev_raw, edit, location=None):
    raw, loc = dev_raw
    raw = copy.deepcopy(raw)
    edit(raw)
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "dev", location or loc, mocks=mocks)
    assert mocks.resources == [], "nothing may be declared"
    return str(e.value)


def test_dev_stack_file_is_valid(dev_raw):
    raw, loc = dev_raw
    cfg = config.load(raw, "dev", loc, mocked.SUBSCRIPTION)
    assert [c.name for c in cfg.clusters] == ["cpu-smoke", "gpu-ib"]
    assert sum(c.max_nodes * c.size.gpus for c in cfg.clusters) == 16


def test_retired_nc24rs_v3_names_the_successors(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][1].update(vmSize="Standard_NC24rs_v3"))
    assert "clusters[1].vmSize = 'Standard_NC24rs_v3'" in msg and "retired by Azure on 2025-09-30" in msg
    for successor in ("ND96asr_v4", "ND96amsr_A100_v4", "ND96isr_H100_v5", "ND96isr_H200_v5"):
        assert successor in msg


def test_unknown_vm_size_lists_the_catalog(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][0].update(vmSize="Standard_Z99"))
    assert (
        "clusters[0].vmSize = 'Standard_Z99': not in the VM-size catalog" in msg and "Standard_ND96isr_H100_v5" in msg
    )


def test_max_nodes_below_min_nodes(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][0].update(minNodes=3, maxNodes=1))
    assert "clusters[0].maxNodes = 1: must be at least minNodes (3)" in msg


def test_overlapping_and_malformed_cidrs(dev_raw):
    msg = bad(dev_raw, lambda r: r["network"].update(privateEndpointSubnetCidr="10.40.8.0/24"))
    assert "network.privateEndpointSubnetCidr = '10.40.8.0/24': overlaps computeSubnetCidr 10.40.0.0/20" in msg
    msg = bad(dev_raw, lambda r: r["network"].update(vnetCidr="10.40.0.0/33"))
    assert "network.vnetCidr = '10.40.0.0/33': not a valid IPv4 CIDR" in msg
    msg = bad(dev_raw, lambda r: r["network"].update(computeSubnetCidr="10.41.0.0/20"))
    assert "must lie inside vnetCidr 10.40.0.0/16" in msg


def test_region_format(dev_raw):
    msg = bad(dev_raw, lambda r: None, location="West Europe")
    assert "azure-native:location = 'West Europe': an Azure region's short name such as westeurope" in msg


def test_gpu_cap(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][1].update(maxNodes=4))
    assert "can scale to 32 GPUs, above maxTotalGpus = 16" in msg


def test_missing_required_keys_are_all_listed(dev_raw):
    def drop(r):
        del r["prefix"], r["network"], r["clusters"]

    msg = bad(dev_raw, drop)
    assert "prefix is missing" in msg and "network is missing" in msg and "clusters is missing" in msg


def test_missing_location():
    raw, _ = mocked.read_stack_file(DEV_FILE)
    with pytest.raises(config.ConfigError, match="azure-native:location is missing"):
        config.load(raw, "dev", None, mocked.SUBSCRIPTION)


def test_the_subscription_must_be_set_in_the_stack():
    # Global names hash the subscription (naming.py): following the CLI's default subscription would plan
    # replacing every globally named resource the day another one is the default.
    raw, loc = mocked.read_stack_file(DEV_FILE)
    with pytest.raises(config.ConfigError) as e:
        config.load(raw, "dev", loc, None)
    assert "azure-native:subscriptionId is missing" in str(e.value)
    assert "pulumi config set azure-native:subscriptionId <id>" in str(e.value)
    with pytest.raises(config.ConfigError, match="azure-native:subscriptionId = 'My Subscription': a subscription id"):
        config.load(raw, "dev", loc, "My Subscription")


def test_compute_subnet_too_small_for_the_nodes(dev_raw):
    msg = bad(dev_raw, lambda r: r["network"].update(computeSubnetCidr="10.40.0.0/29"))
    assert "network.computeSubnetCidr = '10.40.0.0/29': has 3 usable addresses for up to 4 nodes" in msg


def test_out_of_range_and_unknown_choices(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][0].update(priority="Spot"))
    assert "clusters[0].priority = 'Spot': Dedicated or LowPriority" in msg
    # storage and nfs ranges: the data stack's config (tests/infra/test_dataconfig.py)


# Azure Storage's IP rules (https://learn.microsoft.com/azure/storage/common/storage-network-security,
# "Restrictions for IP network rules"): public IPv4 only, no RFC 1918 ranges, no /31 or /32 prefixes.
@pytest.mark.parametrize(
    "ip,expected",
    [
        ("52.10.20.30/32", "does not accept /31 or /32 prefixes; write 52.10.20.30 (no prefix) instead"),
        ("52.10.20.30/31", "write 52.10.20.30 and 52.10.20.31 (no prefix) instead"),
        ("2001:db8::1", "IPv4 only; find your IPv4 address with `curl -4 ifconfig.me`"),
        ("2a01:4f8:c17:1::1", "IPv4 only; find your IPv4 address with `curl -4 ifconfig.me`"),
        ("10.1.2.3", "public internet addresses only"),
        ("192.168.0.0/16", "public internet addresses only"),
        ("52.10.20.1/24", "host bits set; write the network address 52.10.20.0/24 instead"),
        ("my-laptop", "not an IP address or CIDR"),
    ],
)
def test_allowed_client_ips_azure_storage_would_reject(dev_raw, ip, expected):
    msg = bad(dev_raw, lambda r: r["network"].update(allowedClientIps=["52.10.20.40", ip]))
    assert f"network.allowedClientIps = {ip!r}: " in msg and expected in msg
    assert "'52.10.20.40'" not in msg, "a valid address is not reported"


def test_allowed_client_ips_that_azure_takes(dev_raw):
    raw, loc = copy.deepcopy(dev_raw)
    raw["network"]["allowedClientIps"] = ["52.10.20.30", "52.10.21.0/24", "20.30.0.0/30"]
    mocks, _ = mocked.run(raw, "dev", loc)
    rules = one(mocks, "StorageAccount", "ml-storage").inputs["networkRuleSet"]["ipRules"]
    assert [r["iPAddressOrRange"] for r in rules] == ["52.10.20.30", "52.10.21.0/24", "20.30.0.0/30"]
    vault_rules = one(mocks, "Vault", "ml-kv").inputs["properties"]["networkAcls"]["ipRules"]
    assert [r["value"] for r in vault_rules] == ["52.10.20.30", "52.10.21.0/24", "20.30.0.0/30"]


def test_public_access_settings_are_booleans(dev_raw):
    msg = bad(dev_raw, lambda r: r.update(keyVaultPublicAccess="no"))
    assert "keyVaultPublicAccess = 'no': expected bool" in msg


# Keys no level knows: each deployed silently with the default before (a public Key Vault, unrestricted
# outbound, no client IPs, a Dedicated cluster, the default GPU cap).
@pytest.mark.parametrize(
    "edit,key,suggestion",
    [
        (lambda r: r.update(keyVaultPublicAcess=False), "keyVaultPublicAcess", "keyVaultPublicAccess"),
        (lambda r: r["network"].update(restrictOutBound=True), "network.restrictOutBound", "restrictOutbound"),
        (
            lambda r: r["network"].update(allowedClientIPs=["52.10.20.30"]),
            "network.allowedClientIPs",
            "allowedClientIps",
        ),
        (lambda r: r["clusters"][1].update(prority="Dedicated"), "clusters[1].prority", "priority"),
        (lambda r: r.update(maxTotalGPUs=8), "maxTotalGPUs", "maxTotalGpus"),
        (
            lambda r: r.update(users=[{"objectId": "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "typ": "Group"}]),
            "users[0].typ",
            "type",
        ),
    ],
)
def test_unknown_keys_are_refused_with_the_closest_known_one(dev_raw, edit, key, suggestion):
    msg = bad(dev_raw, edit)
    assert f"{key} is not a setting: did you mean {suggestion}?" in msg


def test_an_unknown_key_with_no_close_match_lists_the_settings(dev_raw):
    msg = bad(dev_raw, lambda r: r["network"].update(bastion=True))
    assert "network.bastion is not a setting: the settings here are vnetCidr, computeSubnetCidr" in msg


def test_the_entry_point_reads_every_key_the_stack_sets(monkeypatch):
    # `pulumi up` hands the program every key of the stack file; unknown ones must reach `load` to be refused.
    monkeypatch.setenv(
        "PULUMI_CONFIG",
        '{"azure-horovod-training:keyVaultPublicAcess": "false", '
        '"azure-horovod-training:prefix": "hvd", "azure-native:location": "westeurope"}',
    )
    raw = config.all_settings(config.PROJECT)
    assert raw == {"keyVaultPublicAcess": False, "prefix": "hvd"}


# Azure ML compute nodes run jobs in Docker, whose default bridge is 172.17.0.0/16: a VNet overlapping it
# breaks the nodes' routes into that part of the VNet
# (https://learn.microsoft.com/azure/machine-learning/how-to-secure-training-vnet).
@pytest.mark.parametrize(
    "vnet,compute,endpoints",
    [
        ("172.17.0.0/16", "172.17.0.0/20", "172.17.16.0/24"),
        ("172.16.0.0/12", "172.16.0.0/20", "172.16.16.0/24"),  # contains it
        ("172.17.128.0/17", "172.17.128.0/20", "172.17.144.0/24"),  # inside it
    ],
)
def test_a_vnet_overlapping_dockers_bridge_is_refused(dev_raw, vnet, compute, endpoints):
    msg = bad(
        dev_raw,
        lambda r: r["network"].update(vnetCidr=vnet, computeSubnetCidr=compute, privateEndpointSubnetCidr=endpoints),
    )
    assert f"network.vnetCidr = '{vnet}': overlaps 172.17.0.0/16, the Docker bridge network" in msg


def test_a_vnet_next_to_dockers_bridge_is_fine(dev_raw):
    raw, loc = copy.deepcopy(dev_raw)
    raw["network"].update(
        vnetCidr="172.18.0.0/16", computeSubnetCidr="172.18.0.0/20", privateEndpointSubnetCidr="172.18.16.0/24"
    )
    assert config.load(raw, "dev", loc, mocked.SUBSCRIPTION).network.vnet_cidr == "172.18.0.0/16"


# Azure ML builds images on CPU compute only ("Only a CPU SKU is supported":
# https://learn.microsoft.com/azure/machine-learning/how-to-secure-workspace-vnet, "Enable Azure Container
# Registry (ACR)").
def test_an_image_build_cluster_on_gpus_is_refused(dev_raw):
    msg = bad(dev_raw, lambda r: r.update(imageBuildCluster="gpu-ib"))
    assert (
        "imageBuildCluster = 'gpu-ib': is a GPU cluster (Standard_ND96asr_v4); Azure ML builds images on CPU "
        "compute only: name a CPU cluster (cpu-smoke)" in msg
    )


def test_without_a_cpu_cluster_there_is_nothing_to_build_images_on(dev_raw):
    def gpu_only(r):
        del r["clusters"][0], r["imageBuildCluster"]

    msg = bad(dev_raw, gpu_only)
    assert "no CPU cluster to build images on" in msg


# Azure Storage: "IP network rules have no effect on requests originating from the same Azure region as the
# storage account" (https://learn.microsoft.com/azure/storage/common/storage-network-security): clients in
# the region come in through VNet rules (subnet resource ids).
SUBNET = (
    "/subscriptions/aaaaaaaa-0000-4000-8000-000000000001/resourceGroups/hub-rg/providers/Microsoft.Network/"
    "virtualNetworks/hub-vnet/subnets/bastion"
)


def test_allowed_subnets_become_vnet_rules_of_the_workspace_storage_and_vault(dev_raw):
    raw, loc = copy.deepcopy(dev_raw)
    raw["network"]["allowedSubnetIds"] = [SUBNET]
    mocks, _ = mocked.run(raw, "dev", loc)
    compute = one(mocks, "Subnet", "net-compute").id
    endpoints = one(mocks, "Subnet", "net-endpoints").id  # the studio's data preview (docs/private-access.md)
    rules = one(mocks, "StorageAccount", "ml-storage").inputs["networkRuleSet"]["virtualNetworkRules"]
    assert [r["virtualNetworkResourceId"] for r in rules] == [compute, endpoints, SUBNET]
    vault = one(mocks, "Vault", "ml-kv").inputs["properties"]["networkAcls"]["virtualNetworkRules"]
    assert [r["id"] for r in vault] == [compute, SUBNET]


@pytest.mark.parametrize(
    "subnet",
    [
        "hub-vnet/bastion",
        "/subscriptions/aaaaaaaa-0000-4000-8000-000000000001/resourceGroups/hub-rg/providers/Microsoft.Network/"
        "virtualNetworks/hub-vnet",  # the VNet, not a subnet
        SUBNET.replace("Microsoft.Network", "Microsoft.Compute"),
    ],
)
def test_malformed_subnet_ids_are_refused(dev_raw, subnet):
    msg = bad(dev_raw, lambda r: r["network"].update(allowedSubnetIds=[subnet]))
    assert f"network.allowedSubnetIds = {subnet!r}: a subnet's full resource id" in msg


def test_client_ips_without_subnets_warn_that_the_region_stays_out(dev_raw):
    raw, loc = copy.deepcopy(dev_raw)
    raw["network"]["allowedClientIps"] = ["52.10.20.30"]
    [warning] = config.load(raw, "dev", loc, mocked.SUBSCRIPTION).warnings
    assert "IP rules have no effect on requests from the same Azure region" in warning and "allowedSubnetIds" in warning
    raw["network"]["allowedSubnetIds"] = [SUBNET]
    assert config.load(raw, "dev", loc, mocked.SUBSCRIPTION).warnings == ()
