"""Pulumi entry point (`main: infra/` in Pulumi.yaml): validate the stack config, declare, export."""

import pulumi

from trainingplatform import config, program

settings = config.from_pulumi()  # raises with every config problem listed, before anything is declared
outputs = program.build(
    settings,
    ssh_public_key=pulumi.Config().get_secret("sshPublicKey"),  # clusters with sshEnabled
    jump_host_ssh_public_key=pulumi.Config().get_secret("jumpHostSshPublicKey"),  # the bastion's jump host
)
for key, value in outputs.items():
    pulumi.export(key, value)
