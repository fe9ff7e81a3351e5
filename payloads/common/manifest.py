"""manifest.json: what a shard set holds (classes, per-shard counts and checksums) and whether it is whole.

One manifest per format folder, so a folder uploaded, mounted or downloaded alone describes itself.
`complete` turns true only after the last shard is written (prepare) or verified (download); readers
and uploads refuse a set that is not complete, so nothing half-written ever looks finished.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
from dataclasses import asdict, dataclass, field

from .errors import ConfigError

NAME = "manifest.json"
VERSION = 1
WEBDATASET, TFRECORD = "webdataset", "tfrecord"
FORMATS = (WEBDATASET, TFRECORD)
TRAIN, VALIDATION = "train", "validation"


@dataclass
class Shard:
    name: str  # file name inside the format folder
    samples: int
    bytes: int
    md5: str  # hex; Azure's Content-MD5 is the same digest in base64 (see md5_raw)


@dataclass
class Split:
    inputs: int  # images planned (before corrupt ones were skipped)
    shards: list[Shard] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # [{"path", "error"}]: corrupt inputs, never silent

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)


@dataclass
class Manifest:
    format: str
    classes: list[str]
    plan: dict  # what produced the set; a resume must match it exactly
    splits: dict[str, Split]
    complete: bool = False
    version: int = VERSION

    def to_json(self) -> dict:
        d = asdict(self)
        for name, split in self.splits.items():
            d["splits"][name]["samples"] = split.samples
        return d

    @classmethod
    def from_json(cls, d: dict, source: str = NAME) -> Manifest:
        try:
            if d.get("version") != VERSION:
                raise ConfigError(
                    f"{source} has manifest version {d.get('version')}, this code reads {VERSION}: "
                    "prepare the shards again with this version"
                )
            splits = {
                k: Split(v["inputs"], [Shard(**s) for s in v["shards"]], list(v.get("skipped", [])))
                for k, v in d["splits"].items()
            }
            return cls(d["format"], list(d["classes"]), dict(d["plan"]), splits, bool(d["complete"]), d["version"])
        except (KeyError, TypeError) as e:
            raise ConfigError(
                f"{source} is not a shard manifest ({type(e).__name__}: {e}): prepare the shards "
                "with python -m datatools.prepare"
            ) from None

    def files(self) -> list[Shard]:
        return [s for split in self.splits.values() for s in split.shards]


def md5_file(path: pathlib.Path, chunk: int = 4 << 20) -> str:
    h = hashlib.md5()  # noqa: S324 - a checksum Azure stores (Content-MD5), not security
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def md5_raw(hex_digest: str) -> bytes:
    """The raw digest Azure's SDK wants for ContentSettings.content_md5 (it sends it base64-encoded)."""
    return bytes.fromhex(hex_digest)


def hex_of(content_md5: bytes | bytearray | str | None) -> str | None:
    if content_md5 is None:
        return None
    if isinstance(content_md5, str):  # base64 text, as the REST API sends it
        content_md5 = base64.b64decode(content_md5)
    return bytes(content_md5).hex()


def write(folder: pathlib.Path, m: Manifest) -> None:
    """Atomically: a reader sees the old manifest or the new one, never a torn file."""
    tmp = folder / f".{NAME}.tmp"
    with open(tmp, "w") as f:
        json.dump(m.to_json(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / NAME)


def read(folder: pathlib.Path) -> Manifest | None:
    path = folder / NAME
    if not path.is_file():
        return None
    try:
        return Manifest.from_json(json.loads(path.read_text()), str(path))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not JSON ({e}): prepare or download the shard set again") from None


def load_complete(folder: pathlib.Path, fmt: str) -> Manifest:
    """The manifest of a finished shard set of `fmt`, with every listed shard present at its size."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ConfigError(
            f"--data-dir {folder} is not a folder: point it at a prepared shard folder "
            f"(python -m datatools.prepare writes <output>/{fmt})"
        )
    m = read(folder)
    if m is None:
        hint = f" (it has a {fmt} sub-folder: use {folder / fmt})" if (folder / fmt / NAME).is_file() else ""
        raise ConfigError(
            f"no {NAME} in {folder}{hint}: prepare shards with python -m datatools.prepare, "
            "or download them with python -m datatools.transfer download"
        )
    if m.format != fmt:
        raise ConfigError(f"{folder} holds {m.format} shards, this reader needs {fmt}: use the {fmt} folder")
    if not m.complete:
        raise ConfigError(
            f"the shard set in {folder} is incomplete (its preparation or download was interrupted): "
            "run the same prepare/download command again to finish it"
        )
    for s in m.files():
        p = folder / s.name
        if not p.is_file() or p.stat().st_size != s.bytes:
            raise ConfigError(
                f"shard {p} is missing or not {s.bytes} bytes as {NAME} says: download or prepare "
                "the set again (the command skips shards that are already right)"
            )
    return m
