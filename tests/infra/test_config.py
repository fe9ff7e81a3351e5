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
    cfg = config.load(raw, "dev", loc)
    assert [c.name for c in cfg.clusters] == ["cpu-smoke", "gpu-ib"]
    assert cfg.total_max_gpus == 16


def test_retired_nc24rs_v3_names_the_successors(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][1].update(vmSize="Standard_NC24rs_v3"))
    assert "clusters[1].vmSize = 'Standard_NC24rs_v3'" in msg and "retired by Azure on 2025-09-30" in msg
    for successor in ("ND96asr_v4", "ND96amsr_A100_v4", "ND96isr_H100_v5", "ND96isr_H200_v5"):
        assert successor in msg


def test_unknown_vm_size_lists_the_catalog(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][0].update(vmSize="Standard_Z99"))
    assert "clusters[0].vmSize = 'Standard_Z99': not in the VM-size catalog" in msg and "Standard_ND96isr_H100_v5" in msg


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
        config.load(raw, "dev", None)


def test_compute_subnet_too_small_for_the_nodes(dev_raw):
    msg = bad(dev_raw, lambda r: r["network"].update(computeSubnetCidr="10.40.0.0/29"))
    assert "network.computeSubnetCidr = '10.40.0.0/29': has 3 usable addresses for up to 4 nodes" in msg


def test_out_of_range_and_unknown_choices(dev_raw):
    msg = bad(dev_raw, lambda r: r["clusters"][0].update(priority="Spot"))
    assert "clusters[0].priority = 'Spot': Dedicated or LowPriority" in msg
    # storage and nfs ranges: the data stack's config (tests/infra/test_dataconfig.py)


# Azure Storage's IP rules (https://learn.microsoft.com/azure/storage/common/storage-network-security,
# "Restrictions for IP network rules"): public IPv4 only, no RFC 1918 ranges, no /31 or /32 prefixes.
@pytest.mark.parametrize("ip,expected", [
    ("52.10.20.30/32", "does not accept /31 or /32 prefixes; write 52.10.20.30 (no prefix) instead"),
    ("52.10.20.30/31", "write 52.10.20.30 and 52.10.20.31 (no prefix) instead"),
    ("2001:db8::1", "IPv4 only; find your IPv4 address with `curl -4 ifconfig.me`"),
    ("2a01:4f8:c17:1::1", "IPv4 only; find your IPv4 address with `curl -4 ifconfig.me`"),
    ("10.1.2.3", "public internet addresses only"),
    ("192.168.0.0/16", "public internet addresses only"),
    ("52.10.20.1/24", "host bits set; write the network address 52.10.20.0/24 instead"),
    ("my-laptop", "not an IP address or CIDR"),
])
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
