"""One rank of tests/test_imagefolder.py's two-process run: imagefolder.scan_shared over Horovod (Gloo).

Counts this process's folder listings (os.scandir, os.listdir) inside the tree, then writes what it got to
OUT/rank-<rank>.json: the listing count, the classes, a digest of the samples, or the error it raised."""

import hashlib
import json
import os
import pathlib
import sys

import horovod.torch as hvd

from payloads.common import imagefolder
from payloads.common.errors import ConfigError

tree, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
listings = []


def counting(real):
    def listing(path=".", *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and os.path.abspath(path).startswith(str(tree)):
            listings.append(os.fspath(path))
        return real(path, *args, **kwargs)

    return listing


os.scandir, os.listdir = counting(os.scandir), counting(os.listdir)
hvd.init()
result = {"rank": hvd.rank()}
try:
    got = imagefolder.scan_shared(
        tree, "data directory", hvd.rank(), lambda obj: hvd.broadcast_object(obj, root_rank=0, name="scan_train")
    )
    result.update(
        classes=got.classes,
        samples=len(got.samples),
        root=str(got.root),
        digest=hashlib.sha256(json.dumps(got.samples).encode()).hexdigest(),
        first=got.samples[0],
    )
except ConfigError as e:
    result["config_error"] = str(e)
result["listings"] = len(listings)
(out / f"rank-{hvd.rank()}.json").write_text(json.dumps(result))
sys.exit(3 if "config_error" in result else 0)
