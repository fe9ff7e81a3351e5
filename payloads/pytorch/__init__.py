"""PyTorch + Horovod payload: `python -m payloads.pytorch.train --help`."""
