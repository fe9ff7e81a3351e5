"""The data stack's config: every problem listed with the key, the value and the fix; nothing declared."""

import copy

import pytest

from trainingplatform import config, dataconfig, mocked


def bad(dev_data_raw, edit):
    raw, loc = copy.deepcopy(dev_data_raw[0]), dev_data_raw[1]
    edit(raw)
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run_data(raw, "dev", loc, mocks=mocks)
    assert mocks.resources == [], "nothing may be declared"
    return str(e.value)


def test_dev_data_stack_file_is_valid(dev_data_raw):
    cfg = dataconfig.load(dev_data_raw[0], "dev", dev_data_raw[1], mocked.SUBSCRIPTION)
    assert (cfg.prefix, cfg.location, cfg.storage.data_container, cfg.nfs.enabled) == (
        "hvd",
        "westeurope",
        "training-data",
        True,
    )


def test_out_of_range_and_unknown_choices(dev_data_raw):
    msg = bad(
        dev_data_raw, lambda r: (r["nfs"].update(quotaGiB=50), r["storage"].update(softDeleteDays=0, replication="GRS"))
    )
    assert "nfs.quotaGiB = 50: premium NFS shares take 100 to 102400 GiB" in msg
    assert "storage.softDeleteDays = 0: 1 to 365 days" in msg
    assert "storage.replication = 'GRS': LRS or ZRS" in msg


def test_retain_on_delete_is_refused_rather_than_ignored(dev_data_raw):
    msg = bad(dev_data_raw, lambda r: r["storage"].update(retainOnDelete=False))
    assert "storage.retainOnDelete = False: no longer a setting: the data stack's resources are always protected" in msg


def test_bad_prefix_region_and_client_ip(dev_data_raw):
    # The same IP rules as the platform's (networkconfig.read_client_ips; Azure Storage's firewall rules).
    msg = bad(dev_data_raw, lambda r: r.update(prefix="Team_B", allowedClientIps=["10.0.0.1", "52.10.20.30/32"]))
    assert "prefix = 'Team_B': 2-8 lowercase letters and digits" in msg
    assert "allowedClientIps = '10.0.0.1': storage firewall rules take public internet addresses only" in msg
    assert "allowedClientIps = '52.10.20.30/32': Azure Storage does not accept /31 or /32 prefixes" in msg


def test_the_platform_refuses_data_keys_and_says_where_they_went(dev_raw):
    raw = dict(copy.deepcopy(dev_raw[0]), storage={"dataContainer": "x"}, nfs={"enabled": True})
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "dev", dev_raw[1], mocks=mocks)
    for key in ("storage", "nfs"):
        assert (
            f"{key} is set in the platform's stack file, but the durable data has a stack of its own now: move "
            f"the key to infra/data-stack/Pulumi.<stack>.yaml (as azure-horovod-training-data:{key})"
        ) in str(e.value)
    assert mocks.resources == []


def test_bad_data_stack_reference(dev_raw):
    with pytest.raises(config.ConfigError, match="dataStack = 'dev-data': a fully qualified stack name"):
        config.load(dict(copy.deepcopy(dev_raw[0]), dataStack="dev-data"), "dev", dev_raw[1], mocked.SUBSCRIPTION)


@pytest.mark.parametrize(
    "edit,key,suggestion",
    [
        (lambda r: r.update(allowedClientIP=["52.10.20.30"]), "allowedClientIP", "allowedClientIps"),
        (lambda r: r["storage"].update(softDeleteDay=30), "storage.softDeleteDay", "softDeleteDays"),
        (lambda r: r["nfs"].update(quotaGib=200), "nfs.quotaGib", "quotaGiB"),
        (lambda r: r.update(user=[]), "user", "users"),
    ],
)
def test_unknown_keys_are_refused_with_the_closest_known_one(dev_data_raw, edit, key, suggestion):
    assert f"{key} is not a setting: did you mean {suggestion}?" in bad(dev_data_raw, edit)


def test_subscription_is_required(dev_data_raw):
    with pytest.raises(config.ConfigError, match="azure-native:subscriptionId is missing.*in infra/data-stack"):
        dataconfig.load(copy.deepcopy(dev_data_raw[0]), "dev", dev_data_raw[1], None)


SUBNET = (
    "/subscriptions/aaaaaaaa-0000-4000-8000-000000000001/resourceGroups/hub-rg/providers/Microsoft.Network/"
    "virtualNetworks/hub-vnet/subnets/runners"
)


def test_allowed_subnets_open_the_data_accounts_to_that_subnet(dev_data_raw):
    # Same-region clients are not admitted by IP rules (storage-network-security): a VNet rule is their way in,
    # and it acts on the public endpoint, so public network access is on (default action still Deny).
    raw = dict(copy.deepcopy(dev_data_raw[0]), allowedSubnetIds=[SUBNET])
    mocks, _ = mocked.run_data(raw, "dev", dev_data_raw[1])
    for name in ("storage-data", "storage-logs"):
        acct = next(r for r in mocks.resources if r.name == name).inputs
        assert acct["publicNetworkAccess"] == "Enabled" and acct["networkRuleSet"]["defaultAction"] == "Deny"
        assert [r["virtualNetworkResourceId"] for r in acct["networkRuleSet"]["virtualNetworkRules"]] == [SUBNET]
        assert acct["networkRuleSet"]["ipRules"] == []
    cfg = dataconfig.load(
        dict(copy.deepcopy(dev_data_raw[0]), allowedClientIps=["52.10.20.30"]),
        "dev",
        dev_data_raw[1],
        mocked.SUBSCRIPTION,
    )
    assert any("same Azure region" in w for w in cfg.warnings)


def test_an_existing_data_stack_keeps_its_resource_group_name(dev_data_raw):
    raw = dict(copy.deepcopy(dev_data_raw[0]), resourceGroupName="hvd-dev-data-rg")
    mocks, out = mocked.run_data(raw, "dev", dev_data_raw[1])
    assert out["resource_group"] == "hvd-dev-data-rg"
    assert "resourceGroupName = 'bad.': 1-90 letters" in bad(dev_data_raw, lambda r: r.update(resourceGroupName="bad."))
