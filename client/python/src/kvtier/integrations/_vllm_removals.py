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
from zmq.utils.monitor import parse_monitor_message
from vllm.distributed.kv_events import MEDIUM_CPU, BlockRemoved
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import ExternalBlockHash

logger = init_logger("vllm.kvtier_connector")

# Chunks remembered at most (about 200 bytes each with 16 block hashes): the oldest are
# forgotten first, and their evictions are then not relayed (a router keeps a stale entry: a
# miss, not a wrong byte).
MAX_CHUNKS = 1_000_000
# Seconds the SUB socket may go without connecting to anything at the endpoint before the relay
# warns (once) that nothing listens there. ZMQ connects lazily and retries, so a kvtierd that
# starts later is no error; its events are (a store of a chunk kvtierd holds publishes none,
# so silence alone says nothing).
CONNECT_WARN_S = 30.0


class _RemovalRelay:
    """A SUB socket on kvtierd's events endpoint, read without blocking at each scheduler step
    (``take_events``), and the block hashes of the chunks announced."""

    def __init__(self, endpoint: str, groups: list[int], max_chunks: int = MAX_CHUNKS) -> None:
        self._endpoint = endpoint
        self._groups = groups
        self._max = max_chunks
        self._chunks: OrderedDict[bytes, list[ExternalBlockHash]] = OrderedDict()
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.LINGER, 0)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_CONNECTED)
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise ValueError(f"kvtier: kvtierd_events {endpoint!r} is not a ZMQ endpoint "
                             f"(kvtierd's --events-address, e.g. tcp://127.0.0.1:5557): {e}"
                             ) from e
        self._started = time.monotonic()
        self._connected = False  # the SUB socket reached a listener at the endpoint
        self._warned_unconnected = False
        self._warned_undecodable = False
        self._decoder = msgspec.msgpack.Decoder()

    def remember(self, chunk_keys: list[bytes], block_hashes: list[ExternalBlockHash]) -> None:
        """The chunks `chunk_keys` of one store cover `block_hashes`, in order (the same number
        of blocks each)."""
        if not chunk_keys:
            return
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
                self._warn_if_unconnected()
                return removed
            hashes = self._removed_hashes(frames)
            if hashes:
                removed.extend(BlockRemoved(block_hashes=hashes, medium=MEDIUM_CPU, group_idx=g,
                                            locality="LOCAL") for g in self._groups)

    def _warn_if_unconnected(self) -> None:
        if self._connected or self._warned_unconnected:
            return
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(flags=zmq.NOBLOCK))
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_CONNECTED:
                self._connected = True
                return
        if time.monotonic() - self._started >= CONNECT_WARN_S:
            self._warned_unconnected = True
            logger.warning("kvtier: nothing listens at kvtierd_events %r after %.0f s, so "
                           "kvtierd's evictions are not relayed as BlockRemoved: is it the "
                           "address kvtierd was started with (--events-address), reachable "
                           "from here?", self._endpoint, CONNECT_WARN_S)

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
            # Once, not every step: a publisher that is not kvtierd (vLLM's own events on the
            # same port, say) sends nothing else.
            log = logger.debug if self._warned_undecodable else logger.warning
            self._warned_undecodable = True
            log("kvtier: a message on kvtierd_events %r is not a kvtierd KV event batch (%s); "
                "skipped (is another publisher at that address?)", self._endpoint, err)
            return []

    def close(self) -> None:
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)


def removal_relay(endpoint: str, groups: list[int],
                  events_enabled: bool) -> Optional[_RemovalRelay]:
    """The relay of kvtierd's events at `endpoint` (BlockRemoved for each of `groups`, vLLM's
    indices of the KV groups), or None when it is empty or vLLM's KV cache
    events are off (then with a warning: there is no stream to relay into)."""
    if not endpoint:
        return None
    if not events_enabled:
        logger.warning("kvtier: kvtierd_events is set but vLLM's KV cache events are off "
                       "(--kv-events-config with enable_kv_cache_events): no evictions are "
                       "relayed")
        return None
    return _RemovalRelay(endpoint, groups)
