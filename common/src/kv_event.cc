#include "kvtier/kv_event.h"

#define MSGPACK_NO_BOOST 1
#include <array>
#include <cstring>
#include <msgpack.hpp>

namespace kvtier {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackKey(Packer& pk, const ChunkKey& key) {
  std::array<std::byte, ChunkKey::kBytes> bytes;
  key.ToBytes(bytes.data());
  pk.pack_bin(ChunkKey::kBytes);
  pk.pack_bin_body(reinterpret_cast<const char*>(bytes.data()), ChunkKey::kBytes);
}

void PackHashes(Packer& pk, const std::vector<ChunkKey>& keys) {
  pk.pack_array(static_cast<uint32_t>(keys.size()));
  for (const ChunkKey& k : keys) PackKey(pk, k);
}

void PackEvent(msgpack::sbuffer& buf, Packer& pk, const KvEvent& e) {
  switch (e.type) {
    case KvEventType::kBlockStored: {
      // A map16 header even for 8 entries, as msgspec writes a struct of more
      // than 15 fields (BlockStored has 17, those at their default omitted):
      // the bytes are then exactly vLLM's.
      const char map16_of_8[] = {'\xde', '\x00', '\x08'};
      buf.write(map16_of_8, sizeof(map16_of_8));
      PackStr(pk, "type");
      PackStr(pk, KvEventTypeName(e.type));
      PackStr(pk, "block_hashes");
      PackHashes(pk, e.block_hashes);
      PackStr(pk, "parent_block_hash");
      if (e.parent) {
        PackKey(pk, *e.parent);
      } else {
        pk.pack_nil();
      }
      PackStr(pk, "token_ids");
      pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
      for (int32_t t : e.token_ids) pk.pack_int32(t);
      PackStr(pk, "block_size");
      pk.pack_uint32(e.block_size);
      PackStr(pk, "lora_id");
      pk.pack_nil();
      PackStr(pk, "medium");
      PackStr(pk, KvMediumName(e.medium));
      PackStr(pk, "lora_name");
      pk.pack_nil();
      return;
    }
    case KvEventType::kBlockRemoved:
      pk.pack_map(3);
      PackStr(pk, "type");
      PackStr(pk, KvEventTypeName(e.type));
      PackStr(pk, "block_hashes");
      PackHashes(pk, e.block_hashes);
      PackStr(pk, "medium");
      PackStr(pk, KvMediumName(e.medium));
      return;
    case KvEventType::kAllBlocksCleared:
      pk.pack_map(1);
      PackStr(pk, "type");
      PackStr(pk, KvEventTypeName(e.type));
      return;
  }
}

Status Bad(const std::string& what) { return Status::InvalidArgument("KV event batch: " + what); }

std::string_view Str(const msgpack::object& o) {
  return o.type == msgpack::type::STR ? std::string_view(o.via.str.ptr, o.via.str.size)
                                      : std::string_view();
}

Result<ChunkKey> KeyOf(const msgpack::object& o, const char* field) {
  if (o.type != msgpack::type::BIN || o.via.bin.size != ChunkKey::kBytes) {
    return Bad(std::string(field) + " is not 16 bytes of bin");
  }
  return ChunkKey::FromBytes(reinterpret_cast<const std::byte*>(o.via.bin.ptr));
}

Result<KvEvent> DecodeEvent(const msgpack::object& o) {
  if (o.type != msgpack::type::MAP) return Bad("an event is not a map");
  KvEvent e;
  bool typed = false;
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const std::string_view name = Str(o.via.map.ptr[i].key);
    const msgpack::object& v = o.via.map.ptr[i].val;
    if (name == "type") {
      const std::string_view t = Str(v);
      if (t == "BlockStored") {
        e.type = KvEventType::kBlockStored;
      } else if (t == "BlockRemoved") {
        e.type = KvEventType::kBlockRemoved;
      } else if (t == "AllBlocksCleared") {
        e.type = KvEventType::kAllBlocksCleared;
      } else {
        return Bad("unknown event type '" + std::string(t) + "'");
      }
      typed = true;
    } else if (name == "block_hashes") {
      if (v.type != msgpack::type::ARRAY) return Bad("block_hashes is not an array");
      for (uint32_t j = 0; j < v.via.array.size; ++j) {
        auto k = KeyOf(v.via.array.ptr[j], "a block hash");
        if (!k.ok()) return k.status();
        e.block_hashes.push_back(*k);
      }
    } else if (name == "parent_block_hash" && v.type != msgpack::type::NIL) {
      auto k = KeyOf(v, "parent_block_hash");
      if (!k.ok()) return k.status();
      e.parent = *k;
    } else if (name == "token_ids") {
      if (v.type != msgpack::type::ARRAY) return Bad("token_ids is not an array");
      e.token_ids.reserve(v.via.array.size);
      for (uint32_t j = 0; j < v.via.array.size; ++j) {
        const msgpack::object& t = v.via.array.ptr[j];
        if (t.type == msgpack::type::POSITIVE_INTEGER) {
          e.token_ids.push_back(static_cast<int32_t>(t.via.u64));
        } else if (t.type == msgpack::type::NEGATIVE_INTEGER) {
          e.token_ids.push_back(static_cast<int32_t>(t.via.i64));
        } else {
          return Bad("a token id is not an integer");
        }
      }
    } else if (name == "block_size") {
      if (v.type != msgpack::type::POSITIVE_INTEGER) return Bad("block_size is not an integer");
      e.block_size = static_cast<uint32_t>(v.via.u64);
    } else if (name == "medium" && v.type != msgpack::type::NIL) {
      auto m = KvMediumFromName(Str(v));
      if (!m) return Bad("unknown medium '" + std::string(Str(v)) + "'");
      e.medium = *m;
    }
  }
  if (!typed) return Bad("an event has no type tag");
  return e;
}

}  // namespace

std::string_view KvEventTypeName(KvEventType type) {
  switch (type) {
    case KvEventType::kBlockStored:
      return "BlockStored";
    case KvEventType::kBlockRemoved:
      return "BlockRemoved";
    case KvEventType::kAllBlocksCleared:
      return "AllBlocksCleared";
  }
  return "";
}

std::string_view KvMediumName(KvMedium medium) {
  switch (medium) {
    case KvMedium::kGpu:
      return "GPU";
    case KvMedium::kCpu:
      return "CPU";
    case KvMedium::kStorage:
      return "STORAGE";
  }
  return "";
}

std::optional<KvMedium> KvMediumFromName(std::string_view name) {
  for (KvMedium m : {KvMedium::kGpu, KvMedium::kCpu, KvMedium::kStorage}) {
    if (KvMediumName(m) == name) return m;
  }
  return std::nullopt;
}

std::string EncodeKvEventBatch(const KvEventBatch& batch) {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pk.pack_array(batch.data_parallel_rank ? 3 : 2);
  pk.pack_double(batch.ts);
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& e : batch.events) PackEvent(buf, pk, e);
  if (batch.data_parallel_rank) pk.pack_int64(*batch.data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

Result<KvEventBatch> DecodeKvEventBatch(std::string_view bytes) {
  msgpack::object_handle handle;
  try {
    handle = msgpack::unpack(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    return Bad(std::string("not msgpack: ") + e.what());
  }
  const msgpack::object& o = handle.get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size < 2 || o.via.array.size > 3) {
    return Bad("not an array of 2 or 3 items");
  }
  const msgpack::object* items = o.via.array.ptr;
  KvEventBatch batch;
  if (items[0].type == msgpack::type::FLOAT64 || items[0].type == msgpack::type::FLOAT32) {
    batch.ts = items[0].via.f64;
  } else if (items[0].type == msgpack::type::POSITIVE_INTEGER) {
    batch.ts = static_cast<double>(items[0].via.u64);
  } else {
    return Bad("ts is not a number");
  }
  if (items[1].type != msgpack::type::ARRAY) return Bad("events is not an array");
  for (uint32_t i = 0; i < items[1].via.array.size; ++i) {
    auto e = DecodeEvent(items[1].via.array.ptr[i]);
    if (!e.ok()) return e.status();
    batch.events.push_back(std::move(*e));
  }
  if (o.via.array.size == 3) {
    if (items[2].type == msgpack::type::POSITIVE_INTEGER) {
      batch.data_parallel_rank = static_cast<int64_t>(items[2].via.u64);
    } else if (items[2].type == msgpack::type::NEGATIVE_INTEGER) {
      batch.data_parallel_rank = items[2].via.i64;
    } else if (items[2].type != msgpack::type::NIL) {
      return Bad("data_parallel_rank is not an integer");
    }
  }
  return batch;
}

std::string KvEventSequenceBytes(uint64_t seq) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) out[i] = static_cast<char>(seq & 0xff);
  return out;
}

std::optional<uint64_t> KvEventSequenceFrom(std::string_view bytes) {
  if (bytes.size() != 8) return std::nullopt;
  uint64_t seq = 0;
  for (char c : bytes) seq = seq << 8 | static_cast<uint8_t>(c);
  return seq;
}

}  // namespace kvtier
