"""Each class of bad stack config fails with the key, the value and what is allowed; nothing is declared."""
import copy

import pytest
from infra_helpers import DEV_FILE

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
