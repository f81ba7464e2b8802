"""The vLLM connector's relay of kvtierd's evictions to vLLM's KV cache event stream: a
``BlockRemoved`` (medium ``CPU``) with vLLM's own block hashes for every chunk the connector
announced as stored that kvtierd's DRAM tier lets go (an eviction, ``kvtierctl evict``, a
restart). kvtierd publishes its evictions on its own ZMQ endpoint (``--events-address``), keyed
by chunk key; the connector remembers which vLLM block hashes each chunk it stored covers.
Used by kvtier.integrations.vllm."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Optional

import msgspec
import zmq
from vllm.distributed.kv_events import MEDIUM_CPU, BlockRemoved
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import ExternalBlockHash

logger = init_logger("vllm.kvtier_connector")

# Chunks remembered at most (about 200 bytes each with 16 block hashes): the oldest are
# forgotten first, and their evictions are then not relayed (a router keeps a stale entry: a
# miss, not a wrong byte).
MAX_CHUNKS = 1_000_000
# Seconds after the first store announced with no message at all from the endpoint before the
# relay warns (once) that it may name the wrong thing: kvtierd publishes each chunk it stores.
QUIET_WARN_S = 30.0


class _RemovalRelay:
    """A SUB socket on kvtierd's events endpoint, read without blocking at each scheduler step
    (``take_events``), and the block hashes of the chunks announced."""

    def __init__(self, endpoint: str, groups: int, max_chunks: int = MAX_CHUNKS) -> None:
        self._endpoint = endpoint
        self._groups = groups
        self._max = max_chunks
        self._first_store: Optional[float] = None  # time.monotonic() of the first remember
        self._heard = False  # a message came from the endpoint
        self._warned = False
        self._chunks: OrderedDict[bytes, list[ExternalBlockHash]] = OrderedDict()
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError as e:
            self._socket.close(linger=0)
            raise ValueError(f"kvtier: kvtierd_events {endpoint!r} is not a ZMQ endpoint "
                             f"(kvtierd's --events-address, e.g. tcp://127.0.0.1:5557): {e}"
                             ) from e
        self._decoder = msgspec.msgpack.Decoder()

    def remember(self, chunk_keys: list[bytes], block_hashes: list[ExternalBlockHash]) -> None:
        """The chunks `chunk_keys` of one store cover `block_hashes`, in order (the same number
        of blocks each)."""
        if not chunk_keys:
            return
        if self._first_store is None:
            self._first_store = time.monotonic()
        per_chunk = len(block_hashes) // len(chunk_keys)
        for i, key in enumerate(chunk_keys):
            self._chunks[key] = list(block_hashes[i * per_chunk:(i + 1) * per_chunk])
            self._chunks.move_to_end(key)
        while len(self._chunks) > self._max:
            self._chunks.popitem(last=False)

    def poll(self) -> list[BlockRemoved]:
        """The removals kvtierd published since the last call, of chunks remembered: one
        BlockRemoved per kvtierd event and KV cache group. A message that does not decode as a
        KV event batch is logged and skipped."""
        removed: list[BlockRemoved] = []
        while True:
            try:
                frames = self._socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                self._warn_if_quiet()
                return removed
            self._heard = True
            hashes = self._removed_hashes(frames)
            if hashes:
                removed.extend(BlockRemoved(block_hashes=hashes, medium=MEDIUM_CPU, group_idx=g,
                                            locality="LOCAL") for g in range(self._groups))

    def _warn_if_quiet(self) -> None:
        if self._heard or self._warned or self._first_store is None:
            return
        if time.monotonic() - self._first_store < QUIET_WARN_S:
            return
        self._warned = True
        logger.warning("kvtier: nothing came from kvtierd_events %r in %.0f s although chunks "
                       "were stored, so kvtierd's evictions are not relayed as BlockRemoved: "
                       "is it the address kvtierd was started with (--events-address), "
                       "reachable from here?", self._endpoint, QUIET_WARN_S)

    def _removed_hashes(self, frames: list[bytes]) -> list[ExternalBlockHash]:
        try:
            _, events, _ = self._decoder.decode(frames[-1])
            out: list[ExternalBlockHash] = []
            for e in events:
                if e.get("type") == "AllBlocksCleared":  # a kvtierd restart: DRAM is empty
                    out.extend(h for hashes in self._chunks.values() for h in hashes)
                    self._chunks.clear()
                elif e.get("type") == "BlockRemoved" and e.get("medium") == MEDIUM_CPU:
                    for key in e.get("block_hashes", []):
                        out.extend(self._chunks.pop(bytes(key), []))
            return out
        except (msgspec.DecodeError, ValueError, TypeError, AttributeError) as err:
            logger.warning("kvtier: a message on kvtierd's events endpoint is not a KV event "
                           "batch (%s); skipped", err)
            return []

    def close(self) -> None:
        self._socket.close(linger=0)


def removal_relay(endpoint: str, groups: int) -> Optional[_RemovalRelay]:
    """The relay of kvtierd's events at `endpoint`, or None when it is empty."""
    return _RemovalRelay(endpoint, groups) if endpoint else None

