"""Horovod data-parallel training payloads: the same code on a laptop (Gloo) or an Azure ML cluster."""
