"""The Azure training platform as Pulumi components: one module per concern, wired in program.py."""
