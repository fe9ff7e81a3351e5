"""The way in: how people outside the VNet reach a platform whose workspace, storage and registry take no
public traffic (config `access`, docs/private-access.md).

With public network access off, the workspace, its storage and the registry answer only on their private
endpoints, and those resolve only through the stack's private DNS zones, which privatelink.py links to the
platform VNet alone. So someone must be inside that VNet, or in a network peered with it whose DNS sees the
zones. Declared here, in the stack, so that `pulumi destroy` and `pulumi up` remove and recreate it with
the VNet (the VNet gets a new name each life: a peering or zone link made by hand would point at a VNet
that no longer exists).

- `bastion`: Azure Bastion (Standard: native-client tunnelling, `az network bastion ssh`) in
  `AzureBastionSubnet`, and a Linux jump host in a subnet of its own, reached through Bastion only (no
  public IP), signed in with Entra ID (AADSSHLoginForLinux); its local admin account takes an SSH key only
  (`jumpHostSshPublicKey`: break-glass, never a password). Microsoft's machine-learning-end-to-end-secure
  template deploys Bastion and a jump host by default (it uses a Windows DSVM); here the jump host is also
  where the training images are built and pushed (docs/private-access.md, "Images").
- `hub`: peering both ways with an existing hub VNet (the hub side through a provider for the hub's
  subscription) and every private DNS zone linked to the hub VNet as well; optionally a DNS private
  resolver whose inbound endpoint answers clients whose DNS is not Azure's (on-premises DNS forwarders, VPN).
- `none`: nothing (the public profile; config.py refuses it when the workspace is private).
"""

from __future__ import annotations

import base64
import re

import pulumi
import pulumi_azure_native as azure_native
from pulumi_azure_native import compute, devtestlab, dnsresolver, network, privatedns

from .privatelink import PrivateDnsZones, zone_slug
from .wayinconfig import AccessConfig

# Azure Bastion's subnet must have exactly this name (https://learn.microsoft.com/azure/bastion/configuration-settings#subnet).
BASTION_SUBNET = "AzureBastionSubnet"
# The subnet of a DNS private resolver's inbound endpoint is delegated to the resolver
# (https://learn.microsoft.com/azure/dns/dns-private-resolver-overview#subnet-restrictions).
RESOLVER_DELEGATION = "Microsoft.Network/dnsResolvers"
ADMIN_USER = "azureuser"

# Rootless Docker needs a range of subordinate user and group ids per user in /etc/subuid and /etc/subgid
# (docs.docker.com/engine/security/rootless, "Prerequisites": "/etc/subuid and /etc/subgid should contain at least
# 65,536 subordinate UIDs/GIDs for the user"). `useradd` writes them for local accounts; Entra ID users are not
# made by useradd (AADSSHLoginForLinux resolves them at sign-in), so this PAM session hook gives each one a range
# of its own the first time they sign in over SSH. The ranges start at 2^31: an Entra user's own uid is a hash of
# their identity, in the millions (not a small local id), and a subordinate range must never hold another user's uid
# (a container's root would be that user). SUBID_DIR lets the tests run it on copies of the files. The same first
# sign-in makes the user's home 0700: pam_mkhomedir's default umask is 0022 ("The default value of mask is 0022",
# pam_mkhomedir(8)), which on a shared jump host would let every user read the others' ~/.azure token caches.
SUBID_START = 2**31
SUBID_HOOK = r"""#!/bin/sh
# Give the user signing in a range of 65536 subordinate uids and gids of their own (rootless Docker), once,
# above every Entra user's own uid (from 2^31).
[ "${PAM_TYPE:-open_session}" = open_session ] || exit 0
user="${PAM_USER:?}"
[ "$user" = root ] && exit 0
dir="${SUBID_DIR:-/etc}"
exec 9>>"$dir/.subid.lock"
flock 9
# The first sign-in (no range yet): the home is the user's alone, 0700 (~/.azure holds their token caches), whichever
# PAM module makes it and with whatever umask, before this hook (chmod) or after it (made here first, umask 0077).
if ! awk -F: -v u="$user" '$1 == u { found = 1 } END { exit !found }' "$dir/subuid" 2>/dev/null; then
  home=$(getent passwd "$user" | cut -d: -f6)
  if [ -d "$home" ]; then
    chmod 0700 "$home"
  elif [ -n "$home" ]; then
    mkhomedir_helper "$user" 0077
  fi
fi
for f in "$dir/subuid" "$dir/subgid"; do
  touch "$f"
  awk -F: -v u="$user" '$1 == u { found = 1 } END { exit !found }' "$f" && continue
  next=$(awk -F: 'BEGIN { m = 2147483648 } { e = $2 + $3; if (e > m) m = e } END { printf "%.0f\n", m }' "$f")
  echo "$user:$next:65536" >> "$f"
done
"""

# Docker Engine from Docker's own apt repository, as docs.docker.com/engine/install/ubuntu installs it, with the rootless
# extras. Ubuntu's docker.io has no rootless mode: its 29.1.3 in jammy-updates (29.1.3-0ubuntu3~22.04.2) and in
# noble-updates (29.1.3-0ubuntu3~24.04.2) ship only check-config.sh and nuke-graph-directory.sh under
# /usr/share/docker.io/contrib (dpkg -c of both, 2026-11-26), no dockerd-rootless*.sh. Docker's docker-ce-rootless-extras
# puts dockerd-rootless-setuptool.sh, dockerd-rootless.sh and rootlesskit in /usr/bin (docker-ce-packaging,
# deb/common/rules; it conflicts with Ubuntu's rootlesskit package, and docker-ce with docker.io), where rootless mode's
# docs expect them ("If you installed Docker 20.10 or later with RPM/DEB packages, you should have
# dockerd-rootless-setuptool.sh in /usr/bin", docs.docker.com/engine/security/rootless). The repository's key is
# accepted only with Docker's published fingerprint ("Verify that you now have the key with the fingerprint 9DC8 5822
# 9FC7 DD38 854A E2D8 8D81 803C 0EBF CD88", the same install page's earlier edition): one primary key, that one.
# `install-docker verify FILE` runs the check alone (tests/infra/test_wayin_jumphost.py runs it on keys of its own).
DOCKER_KEY_FINGERPRINT = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
CLOUD_INIT_WAIT = (
    "WaitForCloudInit"  # the jump host's first extension: the login extension's apt waits for cloud-init's
)
# What that extension runs (Custom Script's `script`, base64): cloud-init's end, then apt's own daily jobs, which take
# dpkg's lock on a timer of their own (azure-linux-extensions#1318 names them with cloud-init): apt-daily.service
# (`apt-get update`) and apt-daily-upgrade.service, which runs unattended-upgrade (unattended-upgrades.service is only
# its shutdown helper, active all the time); both are oneshot units, "activating" while they run. Then until nobody
# holds dpkg's frontend lock, an fcntl lock as apt and
# dpkg take it (flock(1) would not see it). Its result is not the stack's: it exits 0 after 30 minutes whatever holds
# the lock, and the login extension's own error then names it; only the ordering matters here.
APT_WAIT = r"""#!/bin/sh
cloud-init status --wait >/dev/null 2>&1
lock="${DPKG_LOCK:-/var/lib/dpkg/lock-frontend}"
deadline=$(($(date +%s) + 1800))
while [ "$(date +%s)" -lt "$deadline" ]; do
  if ! systemctl is-active apt-daily.service apt-daily-upgrade.service | grep -qx -e active -e activating &&
    python3 -c 'import fcntl, sys; fcntl.lockf(open(sys.argv[1], "a"), fcntl.LOCK_EX | fcntl.LOCK_NB)' "$lock" 2>/dev/null; then
    exit 0
  fi
  sleep 5
done
exit 0
"""
DOCKER_PACKAGES = ("docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin", "docker-ce-rootless-extras")
DOCKER_INSTALL = (
    r"""#!/bin/sh
# Docker Engine and its rootless extras from Docker's apt repository (docs.docker.com/engine/install/ubuntu).
set -eu
fingerprint="${DOCKER_KEY_FINGERPRINT:-"""
    + DOCKER_KEY_FINGERPRINT
    + r"""}"
keyring=/etc/apt/keyrings/docker.asc
verify_key() {  # FILE holds exactly one primary key, and its fingerprint is $fingerprint
  GNUPGHOME=$(mktemp -d) gpg --batch --show-keys --with-colons "$1" 2>/dev/null | awk -F: -v want="$fingerprint" '
    $1 == "pub" || $1 == "sub" { kind = $1; if ($1 == "pub") keys++ }
    $1 == "fpr" && kind == "pub" && $10 == want { found = 1 }
    END { exit !(found && keys == 1) }'
}
if [ "${1:-}" = verify ]; then
  verify_key "$2"
  exit
fi
install -m 0755 -d /etc/apt/keyrings
curl -fsSL https://download.docker.com/linux/ubuntu/gpg -o "$keyring.new"
if ! verify_key "$keyring.new"; then
  echo "install-docker: $keyring.new is not Docker's release key $fingerprint; Docker not installed" >&2
  exit 1
fi
mv "$keyring.new" "$keyring"
chmod a+r "$keyring"
. /etc/os-release
echo "deb [arch=$(dpkg --print-architecture) signed-by=$keyring] https://download.docker.com/linux/ubuntu ${UBUNTU_CODENAME:-$VERSION_CODENAME} stable" >/etc/apt/sources.list.d/docker.list
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y """
    + " ".join(DOCKER_PACKAGES)
    + "\n"
)

# The jump host builds and pushes the images (docs/private-access.md) and runs the submission-only install of the
# launcher, doctor and datatools.transfer (requirements-submit.txt: `python3 -m venv`, then pip; no compiler, every
# package a wheel): git and python3-venv from Ubuntu, Docker from Docker's repository (above), the Azure CLI from
# Microsoft's install script, at first boot. Docker without root for every user: the system daemon's socket stays
# root:docker and nobody is added to the docker group ("The docker group grants root-level privileges to the user",
# docs.docker.com/engine/install/linux-postinstall); each user runs their own rootless daemon instead
# (docs.docker.com/engine/security/rootless), whose prerequisites are uidmap (newuidmap/newgidmap), dbus-user-session
# (systemd --user) and slirp4netns (its network), besides the rootless extras' rootlesskit. Ubuntu 24.04 restricts
# unprivileged user namespaces to programs with an AppArmor profile that allows them
# (kernel.apparmor_restrict_unprivileged_userns); its apparmor package ships one for /usr/bin/rootlesskit
# (/etc/apparmor.d/rootlesskit, "profile rootlesskit /usr/bin/rootlesskit flags=(unconfined) { userns, ...",
# apparmor 4.0.1really4.0.1-0ubuntu0.24.04.9), the path docker-ce-rootless-extras installs it to.
JUMP_HOST_PACKAGES = (
    "git",
    "ca-certificates",
    "curl",
    "gnupg",
    "python3-venv",
    "uidmap",
    "dbus-user-session",
    "slirp4netns",
)


def _file(path: str, content: str) -> str:
    return f"  - path: {path}\n    permissions: \"0755\"\n    content: |\n" + "".join(
        f"      {line}\n" if line else "\n" for line in content.splitlines()
    )


CLOUD_INIT = (
    "#cloud-config\n"
    "package_update: true\n"
    f"packages: [{', '.join(JUMP_HOST_PACKAGES)}]\n"
    "write_files:\n"
    + _file("/usr/local/sbin/subid-for-user", SUBID_HOOK)
    + _file("/usr/local/sbin/install-docker", DOCKER_INSTALL)
    + """runcmd:
  - [sh, -c, "curl -sL https://aka.ms/InstallAzureCLIDeb | bash"]
  - [/usr/local/sbin/install-docker]
  - [systemctl, enable, --now, docker]
  - [sh, -c, "echo 'session optional pam_exec.so /usr/local/sbin/subid-for-user' >> /etc/pam.d/sshd"]
"""
)

# The jump host's image: Ubuntu 24.04 LTS (Canonical's "ubuntu-24_04-lts" offer, "server" = its Gen2 SKU). Its
# python3 is 3.12 (3.12.3-0ubuntu2.1, with python3-venv, noble-updates, 2026-11-26), which the launcher supports
# (trainingplatform requires-python >= 3.11; every package of requirements-submit.txt has a cp312, abi3 or pure wheel:
# `pip download --only-binary=:all: --python-version 3.12`). Ubuntu 22.04 has Python 3.10, and its python3.11 and
# python3.11-venv are a release candidate (3.11.0~rc1-1~22.04.1, jammy-updates universe). Entra ID SSH sign-in
# supports "Ubuntu 16.04 to Ubuntu 24.04" (learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux,
# "Supported Linux distributions"). The image is part of the VM's storage profile, which Azure cannot change in
# place either: moving an existing stack's jump host from 22.04 replaces it (JUMP_HOST_REPLACE_ON_CHANGES).
JUMP_HOST_IMAGE = {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}


# Azure cannot change a VM's OS settings after creation: a PUT with another SSH key or custom data fails with
# PropertyChangeNotAllowed ("Changing property 'linuxConfiguration.ssh.publicKeys' is not allowed",
# "Changing property 'customData' is not allowed"; azure-native's compute.OSProfileArgs, from the REST spec,
# on customData and adminUsername: "This property cannot be updated after the VM is created"). So any change
# under osProfile (the key setting `jumpHostSshPublicKey`, CLOUD_INIT) replaces the jump host, and so does another
# image (JUMP_HOST_IMAGE): a VM's OS disk is made from its image once ("Changing property 'imageReference' is not
# allowed"). Deleted first: its NIC belongs to one VM at a time (a second VM on it is refused with NicInUse), and the
# replacement gets a new auto-name. What was on the old VM's disk (Docker layers, clones) goes with it.
JUMP_HOST_REPLACE_ON_CHANGES = ("osProfile", "storageProfile.imageReference")
# Azure's auto-shutdown of one VM (Microsoft.DevTestLab/schedules; wayin.py's _bastion).
SHUTDOWN_PREFIX, SHUTDOWN_TASK = "shutdown-computevm-", "ComputeVmShutdownTask"


# The default azure-native provider signs in with the stack's azure-native: settings (a service principal, OIDC in CI,
# a managed identity); an explicit provider reads none of them, only the ARM_* environment. The hub's provider gets
# the same ones, or CI that signs in through stack config would peer with another identity, or none.
SIGN_IN_SETTINGS = {
    "auxiliaryTenantIds": "list",
    "clientCertificatePassword": "secret",
    "clientCertificatePath": "text",
    "clientId": "text",
    "clientSecret": "secret",
    "disableInstanceDiscovery": "bool",
    "environment": "text",
    "metadataHost": "text",
    "msiEndpoint": "text",
    "oidcRequestToken": "secret",
    "oidcRequestUrl": "text",
    "oidcToken": "secret",
    "oidcTokenFilePath": "text",
    "tenantId": "text",
    "useDefaultAzureCredential": "bool",
    "useMsi": "bool",
    "useOidc": "bool",
}


def sign_in_settings() -> dict:
    """The stack's azure-native sign-in settings, as keyword arguments of azure_native.Provider."""
    settings = pulumi.Config("azure-native")
    read = {"list": settings.get_object, "secret": settings.get_secret, "text": settings.get, "bool": settings.get_bool}
    out = {}
    for key, kind in SIGN_IN_SETTINGS.items():
        value = read[kind](key)
        if value is not None:
            out[re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()] = value
    return out


class WayIn(pulumi.ComponentResource):
    """Outputs (`describe()`): what a user needs to get in: Bastion and jump host names, or the resolver's address.

    Create it after every private endpoint: hub mode links every zone `dns` holds at that point.
    """

    def __init__(
        self,
        name: str,
        resource_group,
        location: str,
        cfg: AccessConfig,
        vnet: network.VirtualNetwork,
        after_subnet: network.Subnet,
        nat_gateway_id,
        dns: PrivateDnsZones,
        tags: dict,
        ssh_public_key: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """ssh_public_key: the jump host's admin key (the `jumpHostSshPublicKey` secret), never the clusters'
        `sshPublicKey`: a change to it replaces the jump host (JUMP_HOST_REPLACE_ON_CHANGES). Required in bastion
        mode (private.jump_host_problems refuses the stack first, with the fix)."""
        super().__init__("trainingplatform:wayin:WayIn", name, None, opts)
        self.cfg = cfg
        self.bastion: network.BastionHost | None = None
        self.jump_host: compute.VirtualMachine | None = None
        self.jump_host_nic: network.NetworkInterface | None = None
        self.resolver_endpoint: dnsresolver.InboundEndpoint | None = None
        self.peerings: list[network.VirtualNetworkPeering] = []
        self.zone_links: dict[str, privatedns.VirtualNetworkLink] = {}
        self._name, self._rg, self._location, self._tags = name, resource_group, location, tags
        self._vnet, self._after = vnet, after_subnet
        if cfg.mode == "bastion":
            self._bastion(nat_gateway_id, ssh_public_key)
        elif cfg.mode == "hub":
            self._hub(dns)
        self.register_outputs({})

    def _subnet(self, label: str, cidr: str, **extra) -> network.Subnet:
        # Azure changes one subnet of a VNet at a time: each waits for the one before.
        subnet = network.Subnet(
            f"{self._name}-{label}",
            resource_group_name=self._rg,
            virtual_network_name=self._vnet.name,
            address_prefix=cidr,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self._after]),
            **extra,
        )
        self._after = subnet
        return subnet

    def _bastion(self, nat_gateway_id, ssh_public_key) -> None:
        cfg, child = self.cfg, pulumi.ResourceOptions(parent=self)
        bastion_subnet = self._subnet("bastion-subnet", cfg.bastion_subnet_cidr, subnet_name=BASTION_SUBNET)
        # Bastion needs a Standard, static public IP (https://learn.microsoft.com/azure/bastion/configuration-settings#public-ip).
        ip = network.PublicIPAddress(
            f"{self._name}-bastion-ip",
            resource_group_name=self._rg,
            location=self._location,
            sku=network.PublicIPAddressSkuArgs(name="Standard"),
            public_ip_allocation_method="Static",
            tags=self._tags,
            opts=child,
        )
        self.bastion = network.BastionHost(
            f"{self._name}-bastion",
            resource_group_name=self._rg,
            location=self._location,
            sku=network.SkuArgs(name="Standard"),
            # Native client (`az network bastion ssh` / `tunnel`): SSH from a laptop's own terminal, and a port
            # forward for a browser's SOCKS proxy to the studio (docs/private-access.md). Standard SKU or higher.
            enable_tunneling=True,
            ip_configurations=[
                network.BastionHostIPConfigurationArgs(
                    name="ipconfig",
                    subnet=network.SubResourceArgs(id=bastion_subnet.id),
                    public_ip_address=network.SubResourceArgs(id=ip.id),
                )
            ],
            tags=self._tags,
            opts=child,
        )
        # The jump host's subnet: no public IP on the VM (Bastion is the only way to it), outbound through the
        # platform's NAT gateway, open to the internet: image builds fetch from PyPI, GitHub and NVIDIA. No
        # NSG: with no public IP, nothing from the internet reaches it, and an NSG without the outbound deny
        # would be exactly what the private profile's policy refuses (docs/private-access.md, "Egress").
        jump_subnet = self._subnet(
            "jumphost-subnet",
            cfg.jump_host_subnet_cidr,
            nat_gateway=network.SubResourceArgs(id=nat_gateway_id),
            default_outbound_access=False,
        )
        nic = self.jump_host_nic = network.NetworkInterface(
            f"{self._name}-jumphost-nic",
            resource_group_name=self._rg,
            location=self._location,
            ip_configurations=[
                network.NetworkInterfaceIPConfigurationArgs(
                    name="ipconfig",
                    subnet=network.SubnetArgs(id=jump_subnet.id),
                    private_ip_allocation_method="Dynamic",
                )
            ],
            tags=self._tags,
            opts=child,
        )
        if ssh_public_key is None:
            raise ValueError("the jump host's admin account needs jumpHostSshPublicKey (key only, no password)")
        # The local admin account is break-glass: an SSH key only, password sign-in off. People sign in with
        # Entra ID (the AADSSHLoginForLinux extension below). Azure Policy 630c64f9-8b6b-4c64-b511-6544ceff6fd6,
        # "Authentication to Linux machines should require SSH keys": "using passwords with SSH still leaves the VM
        # vulnerable to brute-force attacks".
        linux = compute.LinuxConfigurationArgs(
            disable_password_authentication=True,
            ssh=compute.SshConfigurationArgs(
                public_keys=[
                    compute.SshPublicKeyArgs(path=f"/home/{ADMIN_USER}/.ssh/authorized_keys", key_data=ssh_public_key)
                ]
            ),
        )
        self.jump_host = compute.VirtualMachine(
            f"{self._name}-jumphost",
            resource_group_name=self._rg,
            location=self._location,
            hardware_profile=compute.HardwareProfileArgs(vm_size=cfg.jump_host_vm_size),
            identity=compute.VirtualMachineIdentityArgs(type="SystemAssigned"),
            network_profile=compute.NetworkProfileArgs(
                network_interfaces=[compute.NetworkInterfaceReferenceArgs(id=nic.id, primary=True)]
            ),
            os_profile=compute.OSProfileArgs(
                computer_name="jumphost",
                admin_username=ADMIN_USER,
                linux_configuration=linux,
                custom_data=base64.b64encode(CLOUD_INIT.encode()).decode(),
            ),
            storage_profile=compute.StorageProfileArgs(
                image_reference=compute.ImageReferenceArgs(**JUMP_HOST_IMAGE),
                # Room for the Docker layers of both CUDA images and their build stages (docs/images.md, "Size").
                os_disk=compute.OSDiskArgs(
                    create_option="FromImage",
                    disk_size_gb=256,
                    delete_option="Delete",
                    managed_disk=compute.ManagedDiskParametersArgs(storage_account_type="Premium_LRS"),
                ),
            ),
            tags=self._tags,
            opts=pulumi.ResourceOptions(
                parent=self, replace_on_changes=list(JUMP_HOST_REPLACE_ON_CHANGES), delete_before_replace=True
            ),
        )
        # Entra ID sign-in over SSH (https://learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux):
        # users need "Virtual Machine User Login" (or, for sudo, "Virtual Machine Administrator Login") on the VM,
        # and Bastion's native client Reader on the VM, its NIC and the Bastion (access.py grants them). The VM's
        # system-assigned identity above is the extension's requirement ("System-assigned managed identity").
        # The login extension installs its package with apt (aadsshlogin), while cloud-init is still installing the
        # jump host's packages, Docker's repository and the Azure CLI with apt: one of them meets dpkg's lock and the
        # extension fails, and `pulumi up` with it (Azure/azure-linux-extensions#1318). So a first extension waits
        # for cloud-init and apt's daily jobs to finish (APT_WAIT), and the login extension is provisioned after it,
        # in Azure's order (provisionAfterExtensions) and Pulumi's (depends_on).
        # Both go with the VM: Azure refuses to delete or update the extensions of a stopped VM (409 "Cannot modify
        # extensions in the VM when the VM is not running", terraform-provider-azurerm #477, #17251, #26705), which
        # the evening auto-shutdown leaves it. `deleted_with`: a `pulumi destroy` deletes the VM, which takes its
        # extensions with it, and never calls Delete on them. Tag changes stay off them ("Tags on virtual machine
        # extensions can only be updated when the VM is running", MicrosoftDocs/azure-docs#124186): created with the
        # stack's tags, never updated for them. Still refused on a stopped VM: a change to an extension's own
        # settings, and a replacement of the VM (its extensions are deleted first: Pulumi applies `deleted_with` to a
        # destroy, not to a delete-before-replace); docs/stack-lifecycle.md and the doctor say so.
        extension = pulumi.ResourceOptions(parent=self, deleted_with=self.jump_host, ignore_changes=["tags"])
        waited = compute.VirtualMachineExtension(
            f"{self._name}-jumphost-cloud-init-done",
            resource_group_name=self._rg,
            location=self._location,
            vm_name=self.jump_host.name,
            vm_extension_name=CLOUD_INIT_WAIT,
            publisher="Microsoft.Azure.Extensions",
            type="CustomScript",
            type_handler_version="2.1",
            auto_upgrade_minor_version=True,
            settings={"script": base64.b64encode(APT_WAIT.encode()).decode()},
            tags=self._tags,
            opts=extension,
        )
        compute.VirtualMachineExtension(
            f"{self._name}-jumphost-entra-login",
            provision_after_extensions=[CLOUD_INIT_WAIT],
            resource_group_name=self._rg,
            location=self._location,
            vm_name=self.jump_host.name,
            vm_extension_name="AADSSHLoginForLinux",
            publisher="Microsoft.Azure.ActiveDirectory",
            type="AADSSHLoginForLinux",
            type_handler_version="1.0",
            auto_upgrade_minor_version=True,
            tags=self._tags,
            opts=pulumi.ResourceOptions.merge(extension, pulumi.ResourceOptions(depends_on=[waited])),
        )
        self.shutdown: devtestlab.GlobalSchedule | None = None
        if cfg.jump_host_shutdown_time is not None:
            # The VM's auto-shutdown, as Azure declares it: a Microsoft.DevTestLab/schedules resource named
            # "shutdown-computevm-<VM name>" in the VM's resource group, taskType ComputeVmShutdownTask, a daily
            # recurrence and a Windows time zone id, pointing at the VM (targetResourceId). Azure refuses another
            # name (400 Bad Request). It deallocates the VM at that time each day; any of the platform's users
            # starts it again with `az vm start` (access.py grants them that on the VM alone;
            # docs/private-access.md, "What it costs").
            self.shutdown = devtestlab.GlobalSchedule(
                f"{self._name}-jumphost-shutdown",
                name=self.jump_host.name.apply(lambda n: f"{SHUTDOWN_PREFIX}{n}"),
                resource_group_name=self._rg,
                location=self._location,
                status="Enabled",
                task_type=SHUTDOWN_TASK,
                daily_recurrence=devtestlab.DayDetailsArgs(time=cfg.jump_host_shutdown_time),
                time_zone_id=cfg.jump_host_shutdown_time_zone,
                target_resource_id=self.jump_host.id,
                notification_settings=devtestlab.NotificationSettingsArgs(status="Disabled"),
                tags=self._tags,
                # A new VM (any osProfile change replaces it) gets a new auto-name, so a new schedule name.
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )

    def _hub(self, dns: PrivateDnsZones) -> None:
        cfg, child = self.cfg, pulumi.ResourceOptions(parent=self)
        hub_subscription, hub_group, hub_name = cfg.hub
        # The hub may sit in another subscription (a landing zone's connectivity subscription): its side of
        # the peering is declared through a provider for that subscription.
        hub_provider = azure_native.Provider(
            f"{self._name}-hub-provider", subscription_id=hub_subscription, **sign_in_settings(), opts=child
        )
        # https://learn.microsoft.com/azure/virtual-network/virtual-network-peering-overview: a peering is two
        # resources, one on each VNet; gateway transit needs allowGatewayTransit on the hub and
        # useRemoteGateways here (Azure refuses the latter if the hub has no gateway).
        # The hub's side first: its allowGatewayTransit must be in place before this side asks for the
        # hub's gateway (useRemoteGateways).
        from_hub = network.VirtualNetworkPeering(
            f"{self._name}-from-hub",
            resource_group_name=hub_group,
            virtual_network_name=hub_name,
            virtual_network_peering_name=pulumi.Output.concat("to-", self._vnet.name),
            remote_virtual_network=network.SubResourceArgs(id=self._vnet.id),
            allow_virtual_network_access=True,
            allow_forwarded_traffic=True,
            allow_gateway_transit=cfg.use_hub_gateway,
            opts=pulumi.ResourceOptions(parent=self, provider=hub_provider),
        )
        to_hub = network.VirtualNetworkPeering(
            f"{self._name}-to-hub",
            resource_group_name=self._rg,
            virtual_network_name=self._vnet.name,
            remote_virtual_network=network.SubResourceArgs(id=cfg.hub_vnet_id),
            allow_virtual_network_access=True,
            allow_forwarded_traffic=True,
            use_remote_gateways=cfg.use_hub_gateway,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[from_hub]),
        )
        self.peerings = [from_hub, to_hub]
        # Clients in the hub resolve the private endpoints only through zones linked to the hub VNet. With the hub's
        # own zones (access.privateDnsZoneIds) `dns` holds none of the stack's: those are linked to the hub already,
        # and a second link of one name would be refused ("A virtual network cannot be linked to multiple zones with
        # overlapping namespaces").
        for zone_name, zone in dns.zones.items():
            self.zone_links[zone_name] = privatedns.VirtualNetworkLink(
                f"{self._name}-{zone_slug(zone_name)}-hub-link",
                private_zone_name=zone.name,
                resource_group_name=self._rg,
                location="Global",
                registration_enabled=False,
                virtual_network=privatedns.SubResourceArgs(id=cfg.hub_vnet_id),
                tags=self._tags,
                opts=child,
            )
        if cfg.resolver_subnet_cidr:
            subnet = self._subnet(
                "resolver-subnet",
                cfg.resolver_subnet_cidr,
                delegations=[network.DelegationArgs(name="dns-resolver", service_name=RESOLVER_DELEGATION)],
            )
            resolver = dnsresolver.DnsResolver(
                f"{self._name}-resolver",
                resource_group_name=self._rg,
                location=self._location,
                virtual_network=dnsresolver.SubResourceArgs(id=self._vnet.id),
                tags=self._tags,
                opts=child,
            )
            self.resolver_endpoint = dnsresolver.InboundEndpoint(
                f"{self._name}-resolver-inbound",
                resource_group_name=self._rg,
                location=self._location,
                dns_resolver_name=resolver.name,
                ip_configurations=[
                    dnsresolver.IpConfigurationArgs(
                        subnet=dnsresolver.SubResourceArgs(id=subnet.id), private_ip_allocation_method="Dynamic"
                    )
                ],
                tags=self._tags,
                opts=child,
            )

    def describe(self) -> dict:
        out: dict = {"mode": self.cfg.mode}
        if self.bastion is not None:
            out.update(bastion=self.bastion.name, jump_host=self.jump_host.name, jump_host_id=self.jump_host.id)
            if self.cfg.jump_host_shutdown_time is not None:
                out["jump_host_shutdown"] = (
                    f"{self.cfg.jump_host_shutdown_time} {self.cfg.jump_host_shutdown_time_zone}"
                )
        if self.cfg.mode == "hub":
            out["hub_vnet_id"] = self.cfg.hub_vnet_id
            if self.cfg.private_dns_zones:
                out["dns_servers"] = list(self.cfg.dns_servers)
        if self.resolver_endpoint is not None:
            out["dns_resolver_inbound_ip"] = self.resolver_endpoint.ip_configurations.apply(
                lambda c: c[0].private_ip_address if c else None
            )
        return out
