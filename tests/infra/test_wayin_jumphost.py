"""The jump host of the private profile (Pulumi.prod.yaml) under mocks: OS settings that replace the VM instead of
failing, the roles for Bastion and Entra ID sign-in, a key-only admin account, rootless Docker and the tools from
cloud-init, and no role for its own identity. Each test encodes a documented Azure constraint (cited)."""

import base64
import copy
import os
import shutil
import subprocess

import pytest
import yaml
from infra_helpers import one
from wayin_helpers import ALICE, BOB, BUILT_IN_ROLES, HUB, TEAM, problems_of, roles_of, run_stack

from trainingplatform import access, config, mocked, wayin

# ---- issue 28, item 10: the jump host's OS settings cannot change after creation ----

JUMP_KEY = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCjumphostkey jump@laptop"


def test_a_new_jump_host_key_or_cloud_init_replaces_the_vm_instead_of_failing(
    prod, prod_raw, prod_data_out, monkeypatch
):
    # Azure refuses to change a VM's OS profile after creation, with PropertyChangeNotAllowed: "Changing property
    # 'linuxConfiguration.ssh.publicKeys' is not allowed." (github.com/Azure/azure-cli/issues/11840,
    # Azure/azure-quickstart-templates#5442), "Changing property 'customData' is not allowed."
    # (Azure/azure-sdk-for-node#2297); azure-native's VirtualMachine docs (pulumi-azure-native 3.29.0,
    # compute.OSProfileArgs, from the REST spec), custom_data and admin_username: "This property cannot be
    # updated after the VM is created." So a change there must replace the VM (Pulumi's replaceOnChanges)
    # rather than fail in the middle of `up`.
    mocks, _ = prod
    opts = mocks.options["wayin-jumphost"]
    assert "osProfile" in opts.replace_on_changes
    # Deleted first: its NIC belongs to one VM at a time (a second VM on it: NicInUse, "Network Interface ... is
    # used by existing VM"), and the replacement is auto-named anew.
    assert opts.delete_before_replace is True
    before = one(mocks, "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"]
    assert "vmName" not in one(mocks, "compute:VirtualMachine", "wayin-jumphost").inputs  # auto-named

    # Its own key setting: jumpHostSshPublicKey changes the jump host's osProfile ...
    keyed = one(
        run_stack(prod_raw, prod_data_out, jumpHostSshPublicKey=JUMP_KEY)[0], "compute:VirtualMachine", "wayin-jumphost"
    )
    profile = keyed.inputs["osProfile"]
    assert profile != before
    assert profile["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert profile["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == JUMP_KEY
    assert "adminPassword" not in profile
    # ... and the clusters' sshPublicKey does not touch it.
    cluster_key = run_stack(prod_raw, prod_data_out, sshPublicKey="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClusters c@l")[
        0
    ]
    assert one(cluster_key, "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"] == before

    # An edited cloud-init (custom data) changes osProfile too, so it replaces the VM as well.
    monkeypatch.setattr(wayin, "CLOUD_INIT", wayin.CLOUD_INIT + "  - [sh, -c, 'echo edited']\n")
    edited = one(run_stack(prod_raw, prod_data_out)[0], "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"]
    assert edited["customData"] != before["customData"]


def test_a_jump_host_key_without_a_jump_host_is_refused(prod_raw, prod_data_out):
    with pytest.raises(ValueError, match="jumpHostSshPublicKey is set, but only access.mode bastion declares"):
        run_stack(
            prod_raw,
            prod_data_out,
            jumpHostSshPublicKey=JUMP_KEY,
            access={"mode": "hub", "hubVnetId": HUB},
        )


# ---- issue 28, item 6: the roles Bastion's native client and Entra ID sign-in need ----


def test_role_ids_are_azures_built_in_ones():
    assert {role: access.ROLES[role] for role in access.ROLES} == {role: BUILT_IN_ROLES[role] for role in access.ROLES}
    assert {"Reader", "Virtual Machine User Login", "Virtual Machine Administrator Login"} <= set(access.ROLES)


def _way_in_ids(mocks):
    return (
        one(mocks, "compute:VirtualMachine", "wayin-jumphost").id,
        one(mocks, "NetworkInterface", "wayin-jumphost-nic").id,
        one(mocks, "BastionHost", "wayin-bastion").id,
    )


def test_every_user_can_connect_through_bastion_as_an_ordinary_user(prod):
    # Bastion's native client (learn.microsoft.com/azure/bastion/connect-vm-native-client-linux, "Verify roles and
    # ports"): "Reader role on the virtual machine. Reader role on the NIC with private IP of the virtual machine.
    # Reader role on the Azure Bastion resource. Virtual Machine Administrator Login or Virtual Machine User Login
    # role, if you're using the Azure AD sign-in method." Entra ID sign-in
    # (learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux): "Virtual Machine User Login:
    # Users who have this role assigned can log in to an Azure virtual machine with regular user privileges";
    # "Users who are assigned the VM User role won't be able to run sudo."
    mocks, _ = prod  # no `users`: the deployer is the one user
    vm, nic, bastion = _way_in_ids(mocks)
    reader, user_login = access.ROLES["Reader"], access.ROLES["Virtual Machine User Login"]
    roles = roles_of(mocks, mocked.DEPLOYER)
    assert {(reader, vm), (reader, nic), (reader, bastion), (user_login, vm)} <= roles
    assert BUILT_IN_ROLES["Virtual Machine Administrator Login"] not in {role for role, _ in roles}, "no sudo"


def test_jump_host_admins_get_administrator_login_and_everyone_the_readers(prod_raw, prod_data_out):
    users = [
        {"objectId": ALICE, "type": "User"},
        {"objectId": TEAM, "type": "Group"},
        {"objectId": BOB, "type": "User"},
    ]
    way_in = dict(prod_raw[0]["access"], jumpHostAdmins=[{"objectId": BOB.upper(), "type": "User"}])
    builders = [{"objectId": TEAM, "type": "Group"}]  # users besides the deployer on a private registry need them
    mocks, _ = run_stack(prod_raw, prod_data_out, users=users, access=way_in, imageBuilders=builders)
    vm, nic, bastion = _way_in_ids(mocks)
    reader = access.ROLES["Reader"]
    user_login = access.ROLES["Virtual Machine User Login"]
    admin_login = access.ROLES["Virtual Machine Administrator Login"]
    for principal, kind in ((ALICE, "User"), (TEAM, "Group"), (BOB, "User")):
        roles = roles_of(mocks, principal)
        assert {(reader, vm), (reader, nic), (reader, bastion)} <= roles, principal
        logins = {role for role, scope in roles if scope == vm and role in (user_login, admin_login)}
        assert logins == ({admin_login} if principal == BOB else {user_login}), principal
        kinds = {
            r.inputs["principalType"] for r in mocks.of_type("RoleAssignment") if r.inputs["principalId"] == principal
        }
        assert kinds == {kind}
    assert roles_of(mocks, mocked.DEPLOYER) == set(), "a listed set replaces the default"


@pytest.mark.parametrize(
    "admins,message",
    [
        (
            [{"objectId": ALICE, "type": "User"}],
            f"access.jumpHostAdmins[0].objectId = '{ALICE}': not one of the platform's users",
        ),
        (
            [{"objectId": "bob@example.com", "type": "User"}],
            "access.jumpHostAdmins[0].objectId = 'bob@example.com': an Entra object id (a GUID)",
        ),
        (
            [{"objectId": BOB, "type": "user"}],
            "access.jumpHostAdmins[0].type = 'user': User, Group or ServicePrincipal",
        ),
    ],
)
def test_bad_jump_host_admins_are_refused_before_anything_is_declared(prod_raw, prod_data_out, admins, message):
    raw, location = copy.deepcopy(prod_raw)
    raw.update(users=[{"objectId": BOB, "type": "User"}], access=dict(raw["access"], jumpHostAdmins=admins))
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "prod", location, mocks, data_outputs=prod_data_out)
    assert message in str(e.value) and mocks.resources == []


def test_jump_host_admins_belong_to_the_bastion_mode(prod_raw):
    raw = dict(copy.deepcopy(prod_raw[0]), access={"mode": "hub", "hubVnetId": HUB, "jumpHostAdmins": []})
    assert "access.jumpHostAdmins = []: not a setting of mode hub" in problems_of(raw)


# ---- issue 28, item 17: the break-glass admin signs in with a key only; people with Entra ID ----


def test_the_jump_hosts_admin_account_takes_a_key_only(prod):
    # Azure Policy 630c64f9-8b6b-4c64-b511-6544ceff6fd6, "Authentication to Linux machines should require SSH
    # keys": "Although SSH itself provides an encrypted connection, using passwords with SSH still leaves the VM
    # vulnerable to brute-force attacks. The most secure option for authenticating to an Azure Linux virtual
    # machine over SSH is with a public-private key pair, also known as SSH keys." People sign in with Entra ID.
    mocks, _ = prod
    profile = one(mocks, "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"]
    linux = profile["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True and "adminPassword" not in profile
    assert [k["path"] for k in linux["ssh"]["publicKeys"]] == [f"/home/{wayin.ADMIN_USER}/.ssh/authorized_keys"]
    assert not mocks.of_type("RandomPassword"), "no password exists for the jump host, not even in the state"


def test_a_jump_host_without_a_key_is_refused_with_the_fix(prod_raw, prod_data_out):
    raw, location = copy.deepcopy(prod_raw)
    raw["jumpHostSshPublicKey"] = None  # the secret is not set
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "prod", location, mocks, data_outputs=prod_data_out)
    assert "pulumi config set --secret jumpHostSshPublicKey" in str(e.value)
    assert mocks.resources == [], "refused before anything is declared"


# ---- issue 28, item 16: Docker without root for the jump host's users ----


def _cloud_init(mocks) -> dict:
    """The jump host's cloud-init as the program hands it to Azure: the VM's custom data, base64."""
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost")
    return yaml.safe_load(base64.b64decode(vm.inputs["osProfile"]["customData"]))


def test_users_get_docker_without_root_and_nobody_joins_the_docker_group(prod):
    # "The docker group grants root-level privileges to the user" (docs.docker.com/engine/install/linux-postinstall):
    # nobody is put in it. Rootless mode's prerequisites (docs.docker.com/engine/security/rootless): newuidmap and
    # newgidmap (Ubuntu's uidmap), /etc/subuid and /etc/subgid with "at least 65,536 subordinate UIDs/GIDs for the
    # user", and systemd --user (dbus-user-session); slirp4netns for its network.
    init = _cloud_init(prod[0])
    assert init == yaml.safe_load(wayin.CLOUD_INIT)
    assert {"uidmap", "dbus-user-session", "slirp4netns"} <= set(init["packages"])
    text = wayin.CLOUD_INIT
    assert "usermod" not in text and "groups" not in init and "users" not in init and "docker.sock" not in text
    hook = next(f for f in init["write_files"] if f["path"] == "/usr/local/sbin/subid-for-user")
    assert hook["content"] == wayin.SUBID_HOOK and hook["permissions"] == "0755"
    commands = [" ".join(c) if isinstance(c, list) else c for c in init["runcmd"]]
    assert any("pam_exec.so /usr/local/sbin/subid-for-user" in c and "/etc/pam.d/sshd" in c for c in commands)


# ---- issue 28, item 7: the tools on the jump host ----


def test_the_jump_host_runs_ubuntu_24_04_whose_python_runs_the_submission_install(prod):
    # The launcher needs Python 3.11 or later (infra/pyproject.toml: requires-python >= 3.11). Ubuntu 22.04's python3
    # is 3.10 and its python3.11 a release candidate (3.11.0~rc1-1~22.04.1, jammy-updates); Ubuntu 24.04's is 3.12
    # (3.12.3, noble), with python3-venv. Entra ID sign-in supports "Ubuntu 16.04 to Ubuntu 24.04"
    # (learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux).
    mocks, _ = prod
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost")
    assert vm.inputs["storageProfile"]["imageReference"] == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    # The submission-only install: `python3 -m venv`, then pip from requirements-submit.txt (wheels only) and git to
    # clone the repository (docs/private-access.md#tools-on-the-jump-host).
    assert {"python3-venv", "git", "ca-certificates"} <= set(_cloud_init(mocks)["packages"])
    # A VM's image is fixed at creation ("Changing property 'imageReference' is not allowed"): a new one replaces the
    # VM, deleted first (its NIC serves one VM at a time), like an osProfile change.
    opts = mocks.options["wayin-jumphost"]
    assert {"osProfile", "storageProfile.imageReference"} <= set(opts.replace_on_changes)
    assert opts.delete_before_replace is True


def test_docker_comes_from_dockers_repository_with_the_rootless_extras(prod):
    # Ubuntu's docker.io ships no rootless scripts: 29.1.3-0ubuntu3~22.04.2 and ~24.04.2 hold only check-config.sh and
    # nuke-graph-directory.sh under /usr/share/docker.io/contrib (dpkg -c, 2026-11-26). Docker's packages do: "If you
    # installed Docker 20.10 or later with RPM/DEB packages, you should have dockerd-rootless-setuptool.sh in /usr/bin
    # ... you may need to install the docker-ce-rootless-extras package" (docs.docker.com/engine/security/rootless).
    # docker-ce conflicts with docker.io and docker-ce-rootless-extras with Ubuntu's rootlesskit
    # (docker-ce-packaging, deb/common/control): neither is installed beside them.
    init = _cloud_init(prod[0])
    assert not {"docker.io", "rootlesskit", "docker-compose"} & set(init["packages"])
    assert "/usr/share/docker.io/contrib" not in wayin.CLOUD_INIT
    script = next(f for f in init["write_files"] if f["path"] == "/usr/local/sbin/install-docker")
    assert script["content"] == wayin.DOCKER_INSTALL and script["permissions"] == "0755"
    install = [line for line in wayin.DOCKER_INSTALL.splitlines() if line.startswith("DEBIAN_FRONTEND=")]
    assert install and install[0].split("install -y ")[1].split() == list(wayin.DOCKER_PACKAGES)
    assert "docker-ce-rootless-extras" in wayin.DOCKER_PACKAGES
    assert "https://download.docker.com/linux/ubuntu" in wayin.DOCKER_INSTALL
    assert "signed-by=$keyring" in wayin.DOCKER_INSTALL and "set -eu" in wayin.DOCKER_INSTALL
    # Docker is installed before its daemon is enabled, after the packages (cloud-init's packages run before runcmd).
    commands = [" ".join(c) for c in init["runcmd"]]
    assert commands.index("/usr/local/sbin/install-docker") < commands.index("systemctl enable --now docker")


@pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg")
def test_the_docker_repository_key_is_taken_only_with_dockers_fingerprint(tmp_path):
    # The apt source trusts every key in its keyring file (signed-by): the file must hold Docker's release key, "the
    # key with the fingerprint 9DC8 5822 9FC7 DD38 854A E2D8 8D81 803C 0EBF CD88" (docs.docker.com/engine/install/
    # ubuntu, earlier edition), alone. Checked here with keys of our own, by the script's own check.
    assert wayin.DOCKER_KEY_FINGERPRINT == "9DC8 5822 9FC7 DD38 854A E2D8 8D81 803C 0EBF CD88".replace(" ", "")
    script = tmp_path / "install-docker"
    script.write_text(wayin.DOCKER_INSTALL)
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {"PATH": os.environ["PATH"], "GNUPGHOME": str(home)}
    keys = {}
    try:
        for who in ("docker", "other"):
            subprocess.run(
                ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key",
                 f"{who} <{who}@test>", "ed25519", "default", "never"],
                env=env, check=True, capture_output=True,
            )  # fmt: skip
            armored = subprocess.run(
                ["gpg", "--armor", "--export", f"{who}@test"], env=env, check=True, capture_output=True
            )
            (tmp_path / f"{who}.asc").write_bytes(armored.stdout)
            listing = subprocess.run(
                ["gpg", "--show-keys", "--with-colons", str(tmp_path / f"{who}.asc")],
                env=env,
                capture_output=True,
                text=True,
            ).stdout
            keys[who] = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    finally:  # the key generation started a gpg-agent for this home, a daemon that would outlive the test
        if shutil.which("gpgconf"):
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, capture_output=True)
    (tmp_path / "both.asc").write_bytes((tmp_path / "docker.asc").read_bytes() + (tmp_path / "other.asc").read_bytes())
    (tmp_path / "junk.asc").write_text("<html>not a key</html>")

    def verify(name: str) -> int:
        # TMPDIR: the check's `mktemp -d` GnuPG home stays under tmp_path, not in /tmp
        run_env = {"PATH": os.environ["PATH"], "DOCKER_KEY_FINGERPRINT": keys["docker"], "TMPDIR": str(tmp_path)}
        return subprocess.run(["sh", str(script), "verify", str(tmp_path / name)], env=run_env).returncode

    assert verify("docker.asc") == 0
    assert verify("other.asc") != 0, "another key"
    assert verify("both.asc") != 0, "Docker's key plus another: apt would trust both"
    assert verify("junk.asc") != 0, "a page that is no key"
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


def test_the_sign_in_hook_gives_each_user_a_range_of_their_own_once(tmp_path):
    import subprocess

    hook = tmp_path / "hook"
    hook.write_text(wayin.SUBID_HOOK)
    (tmp_path / "subuid").write_text("azureuser:100000:65536\n")

    def sign_in(user):
        env = {"PATH": "/usr/bin:/bin", "PAM_USER": user, "PAM_TYPE": "open_session", "SUBID_DIR": str(tmp_path)}
        subprocess.run(["sh", str(hook)], env=env, check=True)

    for user in ("alice@contoso.com", "bob@contoso.com", "alice@contoso.com", "root"):
        sign_in(user)
    for name in ("subuid", "subgid"):
        rows = [line.split(":") for line in (tmp_path / name).read_text().splitlines()]
        users = [r[0] for r in rows]
        assert sorted(users) == sorted({*users}) and "root" not in users, "one range per user, once"
        assert {"alice@contoso.com", "bob@contoso.com"} <= set(users)
        ranges = sorted((int(r[1]), int(r[1]) + int(r[2])) for r in rows)
        assert all(end - start >= 65536 for start, end in ranges)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:])), "disjoint"
        # Entra users' own uids are hashes in the millions: their ranges start above, and stay in uid_t
        signed_in = [(int(r[1]), int(r[1]) + int(r[2])) for r in rows if r[0] != "azureuser"]
        assert all(start >= wayin.SUBID_START and end < 2**32 for start, end in signed_in), signed_in


def test_no_role_is_ever_given_to_the_jump_hosts_own_identity(prod_raw, prod_data_out):
    """Issue 43, item 13: the jump host's system-assigned identity exists for Entra sign-in over SSH only. Anyone who
    signs in there could use a role given to it (the credential chain once picked it before the person's own sign-in:
    azureaccess/credential.py), so no role assignment anywhere in the platform names it."""
    mocks, _ = run_stack(prod_raw, prod_data_out)
    (vm,) = [r for r in mocks.resources if r.type.endswith(":VirtualMachine")]
    assert vm.inputs["identity"]["type"] == "SystemAssigned"
    own = f"principal-{vm.name}"  # what the mocks answer as its identity's principalId
    assignments = [r for r in mocks.resources if r.type.endswith(":RoleAssignment")]
    assert assignments, "the platform assigns roles: the scan scanned something"
    assert [a.name for a in assignments if a.inputs.get("principalId") == own] == []
    assert all(a.inputs.get("principalId") for a in assignments), "every assignment names its principal"


# ---- issue 54, item 1: the jump host's extensions while the VM is stopped ----


def test_the_extensions_go_with_the_jump_host_and_tag_changes_stay_off_them(prod):
    """Azure refuses to delete or update a stopped VM's extensions (409 "Cannot modify extensions in the VM when the
    VM is not running": terraform-provider-azurerm #477, #17251, #26705), tags included (MicrosoftDocs/azure-docs
    #124186), and the evening auto-shutdown leaves the jump host deallocated. `deleted_with` the VM: `pulumi destroy`
    deletes the VM, whose extensions go with it, and calls no Delete on them; `ignore_changes` on tags: a tag change
    of the stack never updates them."""
    mocks, _ = prod
    tags = one(mocks, "compute:VirtualMachine", "wayin-jumphost").inputs["tags"]
    for name in ("wayin-jumphost-cloud-init-done", "wayin-jumphost-entra-login"):
        opts = mocks.options[name]
        assert opts.deleted_with is not None and opts.deleted_with.pulumi_resource_name == "wayin-jumphost", name
        assert opts.ignore_changes == ["tags"], name
        assert one(mocks, "VirtualMachineExtension", name).inputs["tags"] == tags, "tagged when created"


# ---- issue 54, item 3: the login extension waits for apt's own daily jobs too ----


def _fake_commands(bin_dir, log, running_calls: int):
    """cloud-init, systemctl (apt-daily-upgrade.service running, so "activating" as a oneshot unit, for the first
    `running_calls` checks) and sleep, each logging its call."""
    bin_dir.mkdir()
    scripts = {
        "cloud-init": 'echo "cloud-init $*" >> "$LOG"',
        "systemctl": (
            'echo "systemctl $*" >> "$LOG"\n'
            'echo inactive\n'
            f'[ "$(grep -c systemctl "$LOG")" -le {running_calls} ] && echo activating || echo inactive\n'
            "exit 3"
        ),
        "sleep": 'echo "sleep $*" >> "$LOG"; /bin/sleep 0.05',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log)}


def test_the_wait_before_the_login_extension_outlasts_cloud_init_apt_daily_and_dpkgs_lock(tmp_path):
    """azure-linux-extensions#1318: the login extension's apt fails on dpkg's lock while cloud-init or apt's daily
    jobs hold it. The first extension's script returns only after cloud-init, after apt-daily-upgrade.service (which
    runs unattended-upgrade) stops, and after the frontend lock (an fcntl lock, as dpkg takes it) is free."""
    import fcntl

    log, lock = tmp_path / "log", tmp_path / "lock-frontend"
    env = _fake_commands(tmp_path / "bin", log, running_calls=2)
    script = tmp_path / "wait"
    script.write_text(wayin.APT_WAIT)
    with open(lock, "a") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # as apt would hold it
        waiting = subprocess.Popen(["sh", str(script)], env={**env, "DPKG_LOCK": str(lock)})
        for _ in range(200):
            if log.exists() and log.read_text().count("sleep") >= 4:
                break
            subprocess.run(["sleep", "0.05"])
        assert waiting.poll() is None, "still waiting while the lock is held"
        fcntl.lockf(held, fcntl.LOCK_UN)
    assert waiting.wait(timeout=30) == 0
    calls = log.read_text().splitlines()
    assert calls[0] == "cloud-init status --wait", "cloud-init first"
    assert calls[1] == "systemctl is-active apt-daily.service apt-daily-upgrade.service", calls
    assert calls.count(calls[1]) >= 4 and calls.count("sleep 5") >= 4, calls
    assert "unattended-upgrades.service" not in wayin.APT_WAIT, "its shutdown helper is active all the time"
    log.unlink()  # the lock free: the wait lasts exactly as long as apt-daily-upgrade runs
    assert subprocess.run(["sh", str(script)], env={**env, "DPKG_LOCK": str(lock)}).returncode == 0
    assert log.read_text().count("sleep 5") == 2
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


# ---- issue 54, item 4: Entra users' homes on the shared jump host are their own ----


def test_a_users_home_is_made_theirs_alone_at_their_first_sign_in(tmp_path):
    """~/.azure holds each user's token caches; pam_mkhomedir's default umask 0022 would leave every home readable by
    the other users of the jump host. At the first sign-in the hook makes the home 0700 if a module made it already,
    or makes it itself with umask 0077 (mkhomedir_helper) if not; later sign-ins leave the mode to its owner."""
    homes, bin_dir = tmp_path / "home", tmp_path / "bin"
    homes.mkdir()
    bin_dir.mkdir()
    (bin_dir / "getent").write_text(f'#!/bin/sh\necho "$2:x:1234567:1234567::{homes}/$2:/bin/bash"\n')
    (bin_dir / "mkhomedir_helper").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/made\n')
    for f in ("getent", "mkhomedir_helper"):
        (bin_dir / f).chmod(0o755)
    hook = tmp_path / "hook"
    hook.write_text(wayin.SUBID_HOOK)
    (homes / "alice@contoso.com").mkdir(mode=0o755)  # made by a module before the hook, with umask 0022

    def sign_in(user):
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PAM_USER": user, "SUBID_DIR": str(tmp_path)}
        subprocess.run(["sh", str(hook)], env=env, check=True)

    sign_in("alice@contoso.com")
    assert (homes / "alice@contoso.com").stat().st_mode & 0o777 == 0o700
    sign_in("bob@contoso.com")  # no home yet: the hook makes it, before any later module
    assert (tmp_path / "made").read_text() == "bob@contoso.com 0077\n"
    (homes / "alice@contoso.com").chmod(0o750)  # her own choice, later
    sign_in("alice@contoso.com")
    assert (homes / "alice@contoso.com").stat().st_mode & 0o777 == 0o750, "only the first sign-in"
