"""This rank's batches from a WebDataset shard set, decoded off the training thread.

The set, the rank's part of it, the index of where each image lies and each epoch's order are shardset.py's;
the decoded cache is decodedcache.py's; the worker processes and the shared batch slots are ring.py's. Here:

- `Decoder`: one loader's decoding of one step, sent once to every worker (or run inline with --workers 0). From
  (seed, epoch, rank, step) it derives the step's samples itself, reads their bytes, decodes, augments with a
  generator seeded by (seed, epoch, sample) and writes the batch into a slot. So the crops and the order are the
  same whatever the worker count, and a resumed run repeats a straight one.
- `ShardLoader`: the training process's side. It keeps every free slot busy: the steps of this epoch, then the
  first steps of the next (prefetch across epochs; validation's loader likewise after each pass), and hands the
  loop each batch as a view of its slot: images uint8 NxHxWx3 and labels, valid until the next batch is asked
  for (a GPU copy fences the slot until it is done). The training process touches step numbers and slot numbers,
  never pixels.
- With --gpu-decode the workers only read JPEG headers and pick the crops; the JPEG bytes go through the slot and
  nvJPEG decodes on the device (`GpuDecoded`), or torchvision's CPU decoder where no GPU is present.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import itertools
import logging
import pathlib
import queue
import tempfile
import threading
import weakref

import numpy as np
import torch

from ..common.errors import ConfigError
from . import decodedcache, decoders, ring, shardset
from .data import EpochSteps, Reading, Transform, collate, normalize  # noqa: F401 - Reading, Transform: the API
from .decodedcache import check_room as check_cache_room  # noqa: F401 - the loader's API
from .shardset import ShardSplit, index_shard, open_set, plan, read_shard  # noqa: F401 - the loader's API

log = logging.getLogger(__name__)

PLAIN, FILL, CACHED = 0, 1, 2  # a step's source: the shards; the shards, keeping what it decodes; the cache
META = 8  # --gpu-decode, per sample: kind (1 JPEG in the slot's bytes, 0 pixels), offset, length, top, left, h, w, flip


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's header, without decoding it."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if img.format != "JPEG" or img.mode not in ("RGB", "L"):
            raise decoders.DecodeError(f"{img.format} {img.mode}")
        return img.height, img.width


class SlotSink:
    """Writes a step's samples into one slot of the ring."""

    def __init__(self, view: dict[str, np.ndarray]):
        self.view, self.used = view, 0

    def image(self, j: int, pixels: np.ndarray, label: int) -> None:
        out = self.view["images"][j]
        if pixels.shape != out.shape:
            raise ConfigError(f"the transform gave a {pixels.shape} image, the loader's slots hold {out.shape}")
        out[...] = pixels
        self.view["labels"][j] = label
        if "meta" in self.view:
            self.view["meta"][j, 0] = 0

    def jpeg(self, j: int, data: bytes, params: tuple, label: int) -> None:
        room = self.view["bytes"]
        room[self.used : self.used + len(data)] = np.frombuffer(data, np.uint8)
        self.view["meta"][j] = (1, self.used, len(data), *params)
        self.view["labels"][j] = label
        self.used += len(data)


class ListSink:
    """Collects a step's samples in this process (--workers 0): any transform's shape."""

    def __init__(self):
        self.items, self.labels = [], []

    def image(self, j: int, pixels: np.ndarray, label: int) -> None:
        self.items.append(np.asarray(pixels))
        self.labels.append(label)

    def jpeg(self, j: int, data: bytes, params: tuple, label: int) -> None:
        self.items.append((torch.frombuffer(bytearray(data), dtype=torch.uint8), params))
        self.labels.append(label)


class Decoder:
    """One loader's decoding of a step: picklable, sent once to each worker (or used inline)."""

    def __init__(self, loader: ShardLoader, cache: decodedcache.DecodedCache | None):
        self.index, self.plan, self.reading = loader.index, loader.plan, loader.reading
        self.transform = loader.transform
        self.starts = np.concatenate([[0], np.cumsum(loader.sizes)]).astype(np.int64)
        self.cache = (cache.path, cache.layout) if cache is not None else None
        # With --cache-decoded, epoch 0 (the straight run's filling epoch) reads the plan's files front to back through
        # the shuffle buffer, as without the cache; every later epoch is a full shuffle in key order, whether its
        # pixels come from the cache or (after a resume or a rollback, the cache new or incomplete) from the shards.
        # The order depends on (seed, epoch, rank) and the configuration only, never on the cache's state, so a
        # resumed run repeats the straight one.
        self.full_shuffle = loader.full_shuffle
        self.slots: tuple | None = None  # (path, layout, count) of the ring, set by the loader
        self._attached = False

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")} | {"_attached": False}

    def attach(self) -> None:
        if self._attached:
            return
        self._decode = decoders.make(self.reading.decoder)
        self._cached = decodedcache.Mapped(*self.cache) if self.cache else None
        self._views = None
        if self.slots is not None:
            path, layout, count = self.slots
            ring_ = ring.Slots(path, layout, count)
            self._views = [ring_.view(k) for k in range(count)]
        self._order: tuple = (None, None)
        self._attached = True

    def order(self, epoch: int) -> np.ndarray:
        if self._order[0] != epoch:
            r = self.reading
            if self.full_shuffle and epoch > 0:
                got = shardset.cached_order(shardset.key_order(self.index), r.seed, epoch, r.rank, r.shuffle)
            else:
                got = shardset.epoch_order(self.index, self.plan, r.seed, epoch, r.rank, r.shuffle, r.shuffle_buffer)
            self._order = (epoch, got)
        return self._order[1]

    def run(self, epoch: int, step: int, slot: int, mode: int) -> tuple[int, int, list]:
        """In a worker: the step into slot `slot`; (step, samples kept, [(key, reason) skipped])."""
        kept, skipped = self.decode(epoch, step, mode, SlotSink(self._views[slot]))
        return step, kept, skipped

    def decode(self, epoch: int, step: int, mode: int, sink) -> tuple[int, list]:
        self.attach()
        index = self.index
        positions = self.order(epoch)[self.starts[step] : self.starts[step + 1]]
        kept, skipped, files = 0, [], {}
        try:
            # The step's reads in the files' order, each front to back (what a mount reads ahead for), then decoded
            # in the step's order.
            read = [p for p in positions.tolist() if mode != CACHED or self._cached.status[p] == decodedcache.ABSENT]
            encoded = {p: self._read(files, p) for p in sorted(read)}
            for p in positions.tolist():
                label, key = int(index.label[p]), index.keys[p]
                rng = np.random.default_rng([self.reading.seed, epoch, index.seeds[p]])
                image = None
                if mode == CACHED:
                    status = self._cached.status[p]
                    if status == decodedcache.UNDECODABLE:
                        skipped.append((key, "undecodable when the decoded cache was filled"))
                        continue
                    if status == decodedcache.KEPT:
                        image = self._cached.image(p)
                if image is None:
                    data = encoded[p]
                    if self.reading.encoded:
                        try:
                            h, w = _jpeg_size(data)
                        except Exception:  # noqa: BLE001 - not a plain JPEG (PNG, CMYK, damaged): decoded here
                            pass
                        else:
                            sink.jpeg(kept, data, self.transform.params(h, w, rng), label)
                            kept += 1
                            continue
                    try:
                        image = self._decode(data)
                    except decoders.DecodeError as e:
                        skipped.append((key, str(e)))
                        if mode == FILL:
                            self._cached.status[p] = decodedcache.UNDECODABLE
                        continue
                    if mode == FILL:
                        self._cached.keep(p, image)
                sink.image(kept, np.asarray(self.transform(image, rng)), label)
                kept += 1
        finally:
            for f in files.values():
                f.close()
        return kept, skipped

    def _read(self, files: dict, p: int) -> bytes:
        """Sample p's encoded image; each file opened once per step (a moved or changed file fails with the fix)."""
        i = int(self.index.file[p])
        path = self.index.paths[i]
        f = files.get(i)
        if f is None:
            f = files[i] = shardset.open_shard(path)
            st = shardset.os.fstat(f.fileno())
            if (st.st_size, st.st_mtime_ns) != self.index.stamps[i]:
                raise ConfigError(
                    f"shard {path} changed under a running job (size or time differs from when it was "
                    "indexed): keep a job's data input unchanged while it runs, and run again"
                )
        return shardset.read_at(f, int(self.index.offset[p]), int(self.index.size[p]), path)


class ShardLoader(EpochSteps):
    """This rank's batches of one split: (uint8 NxHxWx3 images, int64 labels, skipped) per step, `len()` steps
    per epoch. `workers` decode processes (0: decode in this process, any transform's output shape)."""

    _ids = itertools.count()

    def __init__(self, split: ShardSplit, reading: Reading, transform):
        r = self.reading = dataclasses.replace(reading, decoder=decoders.resolve(reading.decoder))
        self.split, self.transform = split, transform
        self.plan = plan(split.counts, r.rank, r.size, r.batch)
        self.slot_count = max(4, r.workers + 1) + 2  # the workers' queue, the batch held, the one being copied
        self.sizes = self.plan.batch_sizes[: r.max_steps] if r.max_steps else self.plan.batch_sizes
        self.steps = len(self.sizes)  # a resumed epoch's skipped steps are neither read nor decoded
        # A truncated epoch never reads the whole part, so there is nothing complete to keep.
        self.cache_wanted = r.cache and len(self.sizes) == len(self.plan.batch_sizes)
        self.full_shuffle = bool(self.cache_wanted) and r.shuffle  # the order of every epoch (Decoder.full_shuffle)
        if r.cache and not self.cache_wanted:
            log.warning("--cache-decoded is off: --max-steps-per-epoch stops epochs before the data is read whole")
        if r.cache and r.encoded:
            raise ConfigError("--cache-decoded keeps CPU-decoded images, --gpu-decode decodes on the GPU: choose one")
        cache_dir = r.cache_dir
        self.cache_dir = pathlib.Path(cache_dir) if cache_dir is not None else pathlib.Path(tempfile.gettempdir())
        self.id = next(self._ids)
        self.index: shardset.Index | None = None
        self.cache: decodedcache.DecodedCache | None = None
        self.coder: Decoder | None = None
        self.group: ring.Workers | None = None
        # Ring state: free slots, tasks sent (epoch, step, mode, slot, worker) in order, the next task to send.
        self.free: collections.deque = collections.deque()
        self.sent: collections.deque = collections.deque()
        self.next_task: tuple | None = None
        self.fences: dict[int, object] = {}
        self.held: int | None = None

    # -- start-up: the index, the cache file, the slots, the workers' copies of the decoder
    def _index(self) -> shardset.Index:
        if self.index is None:
            r, paths = self.reading, [str(self.split.files[f]) for f in self.plan.files]
            dims = bool(self.cache_wanted)
            if r.workers > 0:
                self.group = ring.workers(r.workers)
                entries = self.group.call(index_shard, [(p, dims) for p in paths])
            else:
                entries = [index_shard(p, dims) for p in paths]
            self.index = shardset.build_index(self.split, self.plan, r.rank, r.size, entries)
        return self.index

    def cache_bytes(self) -> int:
        """The cache file's exact size, from the images' headers (indexes the files if not done yet)."""
        return decodedcache.Layout(self._index()).file_bytes if self.cache_wanted else 0

    def _start(self) -> None:
        if self.coder is not None:
            return
        index = self._index()
        if self.cache_wanted:
            try:
                self.cache = decodedcache.DecodedCache(self.cache_dir, self.reading.rank, decodedcache.Layout(index))
            except OSError as e:
                self._drop_cache(e)
        coder = Decoder(self, self.cache)
        if self.reading.workers > 0:
            tag, pin = f"rank{self.reading.rank}-{self.id}", self.reading.pin_memory
            slots = ring.make_slots(self._slot_layout(), self.slot_count, tag, pin)
            coder.slots = (slots.path, slots.layout, slots.count)
            try:
                self.group.open(self.id, coder)
            finally:
                slots.unlink()  # mapped by every worker and by this process: gone with the last of them
            self.slots, self.views = slots, [slots.view(k) for k in range(slots.count)]
            self.free.extend(range(slots.count))
            weakref.finalize(self, self.group.close, self.id)
        self.coder = coder  # last: a start that failed is tried again, not left half made

    def _slot_layout(self) -> ring.Layout:
        side = getattr(self.transform, "size", None)
        if not isinstance(side, int):
            raise ConfigError("decode workers write fixed-size crops: give the transform a `size`, or use workers=0")
        batch = max(self.sizes)
        fields = [("labels", "int64", (batch,)), ("images", "uint8", (batch, side, side, 3))]
        if self.reading.encoded:  # the JPEG bytes of the largest `batch` images fit any step
            room = int(np.sort(self.index.size)[-batch:].sum()) if len(self.index) else 1
            fields += [("meta", "int64", (batch, META)), ("bytes", "uint8", (max(room, 1),))]
        return ring.Layout(tuple(fields))

    def _drop_cache(self, e: OSError) -> None:
        """A full folder (another job's files since the check): the run goes on decoding every epoch."""
        self.cache, self.cache_wanted = None, False
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        log.warning(
            "--cache-decoded is off for rank %d: %s in %s (%s); every epoch decodes its images. Fix: --cache-dir "
            "on a local disk with room for the decoded images",
            self.reading.rank,
            "the folder is full" if full else "the cache file failed",
            self.cache_dir,
            e,
        )

    def _mode(self) -> int:
        if self.cache is None:
            return PLAIN
        if self.cache.complete:
            return CACHED
        # A part of an epoch (resumed mid-epoch) does not decode every image: the cache waits for a whole one.
        return FILL if self.skip == 0 else PLAIN

    # -- the batches
    def _checked(self, kept: int, skipped: list) -> None:
        for key, reason in skipped:
            if not self.reading.skip_corrupt:
                raise ConfigError(
                    f"cannot decode sample {key} of the shards in {self.split.folder} ({reason}): "
                    "prepare the set again, or pass --skip-corrupt-images to skip and count such samples"
                )
            log.warning("skipping undecodable sample %s in %s: %s", key, self.split.folder, reason)
        if not kept:
            collate([None] * len(skipped))  # raises: every image of the batch was undecodable

    def __iter__(self):
        self._start()
        mode = self._mode()
        if self.reading.workers == 0:
            yield from self._inline(mode)
        else:
            yield from self._from_ring(mode)
        if mode == FILL:
            self.cache.complete = True
            log.info(
                "kept %d decoded images of rank %d in %s (%.1f MB)",
                len(self.cache),
                self.reading.rank,
                self.cache.path,
                self.cache.nbytes / 1e6,
            )

    def _inline(self, mode: int):
        for step in range(self.skip, len(self.sizes)):
            sink = ListSink()
            kept, skipped = self.coder.decode(self.epoch, step, mode, sink)
            self._checked(kept, skipped)
            labels = torch.tensor(sink.labels, dtype=torch.int64)
            items = sink.items if self.reading.encoded else torch.from_numpy(np.stack(sink.items))
            yield items, labels, len(skipped)

    def _from_ring(self, mode: int):
        if not (self.sent and self.sent[0][:3] == (self.epoch, self.skip, mode)):
            self._drop_sent()  # a resume, or the epoch the loader guessed is not the one asked for
            self.next_task = (self.epoch, self.skip, mode)
        try:
            for step in range(self.skip, len(self.sizes)):
                self._send()
                epoch, sent_step, _, slot, w = self.sent.popleft()
                assert (epoch, sent_step) == (self.epoch, step), (epoch, sent_step, self.epoch, step)
                try:
                    _, kept, skipped = self.group.recv(w, self.id)
                except BaseException:
                    self.free.append(slot)  # the step failed: its slot is free again, whatever comes next
                    raise
                self._release()
                self.held = slot
                self._checked(kept, skipped)
                yield self._batch(slot, kept, len(skipped))
        finally:
            self._release()
        self._send()  # the next epoch's first steps decode while this one's validation and checkpoint run

    def prefetch(self) -> None:
        """Starts the workers on this loader's next pass now (the validation loader: during the first epoch)."""
        self._start()
        if self.reading.workers and not self.sent:
            self.next_task = (self.epoch, self.skip, self._mode())
            self._send()

    def _send(self) -> None:
        """Fills every free slot with the next task: this epoch's steps, then the next epoch's (not after a
        filling epoch: the next one reads the cache, complete only when this one's last step is done)."""
        while self.free and self.next_task is not None:
            epoch, step, mode = self.next_task
            slot = self.free.popleft()
            fence = self.fences.pop(slot, None)
            if fence is not None:
                fence.synchronize()  # the device copy out of this slot is done before a worker writes it
            w = (step + epoch * len(self.sizes)) % len(self.group)
            self.group.send(w, ("step", self.id, epoch, step, slot, mode))
            self.sent.append((epoch, step, mode, slot, w))
            if step + 1 < len(self.sizes):
                self.next_task = (epoch, step + 1, mode)
            else:
                self.next_task = None if mode == FILL else (epoch + 1, 0, mode)

    def _drop_sent(self) -> None:
        while self.sent:
            *_, slot, w = self.sent.popleft()
            try:
                self.group.recv(w, self.id)
            except ConfigError:
                pass  # a step nobody asks for: its error does not matter
            finally:
                self.free.append(slot)

    def _release(self) -> None:
        if self.held is not None:
            self.free.append(self.held)
            self.held = None

    def fence(self, event) -> None:
        """The device copy of the batch last handed out ends with `event`: its slot waits for it before reuse."""
        if self.held is not None:
            self.fences[self.held] = event

    def _batch(self, slot: int, kept: int, skipped: int):
        view = self.views[slot]
        labels = torch.from_numpy(view["labels"][:kept])  # a view too: copied to the device from pinned memory
        if not self.reading.encoded:
            return torch.from_numpy(view["images"][:kept]), labels, skipped
        items = []
        for j, (kind, at, n, *params) in enumerate(view["meta"][:kept].tolist()):
            if kind == 1:
                items.append((torch.from_numpy(view["bytes"][at : at + n]), (*params[:4], bool(params[4]))))
            else:
                items.append(view["images"][j])
        return items, labels, skipped

    def on_device(self, device: torch.device, channels_last: bool) -> GpuDecoded:
        return GpuDecoded(self, device, channels_last)


class GpuDecoded:
    """--gpu-decode: the loader's JPEGs decoded by nvJPEG (torchvision.io.decode_jpeg on the device), cropped,
    resized and flipped there, then normalised; samples the workers decoded (PNG, CMYK) join as pixels.
    A thread of its own does it, one batch ahead, on a side CUDA stream: the training thread launches none of the
    per-image work and never waits in decode_jpeg (which returns once nvJPEG's stream is done, cudaStreamSynchronize
    in torchvision's decode_jpegs_cuda); it takes each batch after an event. Labels and pixels are copied from the
    pinned slots without blocking. Without a GPU the same code runs torchvision's CPU decoder: the fallback the tests
    check."""

    def __init__(self, loader: ShardLoader, device: torch.device, channels_last: bool):
        self.loader, self.device, self.channels_last = loader, device, channels_last
        self.size = loader.transform.size

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.loader.set_epoch(epoch, skip)

    def pixels(self, items: list) -> torch.Tensor:
        """uint8 NxHxWx3 on the device from a batch's items."""
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional as F

        jpegs = [i for i, item in enumerate(items) if isinstance(item, tuple)]
        encoded = [items[i][0] for i in jpegs]
        decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device) if jpegs else []
        out = [None] * len(items)
        for i, image in zip(jpegs, decoded):
            top, left, h, w, flip = items[i][1]
            x = F.resized_crop(image, top, left, h, w, [self.size, self.size], antialias=True)
            out[i] = (x.flip(-1) if flip else x).permute(1, 2, 0)
        for i, item in enumerate(items):
            if out[i] is None:
                out[i] = torch.from_numpy(np.ascontiguousarray(item)).to(self.device, non_blocking=True)
        return torch.stack(out)

    def _ahead(self, handed: queue.Queue, stop: threading.Event) -> None:
        """The thread: each batch on the device, with the event the training thread waits for (None on a CPU)."""
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        batches = iter(self.loader)
        try:
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                for items, labels, skipped in batches:
                    # copy=True: on a CPU too, since the slot is written again while the loop still uses the labels
                    moved = labels.to(self.device, non_blocking=True, copy=True)
                    batch, done = (normalize(self.pixels(items), self.channels_last), moved), None
                    if cuda:  # the slot's bytes and labels are read by copies that may still run
                        done = torch.cuda.Event()
                        done.record(stream)
                        self.loader.fence(done)
                    if not _put(handed, (*batch, skipped, done), stop):
                        return
            _put(handed, None, stop)
        except BaseException as e:  # noqa: BLE001 - raised in the training thread, which ends the run with it
            _put(handed, e, stop)
        finally:
            batches.close()

    def __iter__(self):
        handed, stop = queue.Queue(maxsize=1), threading.Event()
        thread = threading.Thread(target=self._ahead, args=(handed, stop), name="gpu-decode", daemon=True)
        thread.start()
        try:
            while (got := handed.get()) is not None:
                if isinstance(got, BaseException):
                    raise got
                images, labels, skipped, done = got
                if done is not None:
                    compute = torch.cuda.current_stream(self.device)
                    compute.wait_event(done)
                    for t in (images, labels):  # made on the thread's stream: keep the allocator off them
                        t.record_stream(compute)
                yield images, labels, skipped
        finally:
            stop.set()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    handed.get(timeout=0.05)  # a batch it is still handing over


def _put(handed: queue.Queue, item, stop: threading.Event) -> bool:
    """Hands `item` over, waiting while the training thread has one; False once it has stopped taking them."""
    while not stop.is_set():
        with contextlib.suppress(queue.Full):
            handed.put(item, timeout=0.05)
            return True
    return False


def datasets(data_dir: pathlib.Path):
    """(train, validation or None, number of classes) for the training payload."""
    train, val, classes = open_set(data_dir)
    return train, val, len(classes)
