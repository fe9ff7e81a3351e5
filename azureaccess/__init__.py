"""What every tool that reaches the deployed platform from this machine shares (the launcher, azurecheck, the data
tools): the person's sign-in (credential.py), the stack outputs (stack.py) and the one error for bad input, named
with its fix (errors.py)."""
