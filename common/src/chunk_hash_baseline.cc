// chunk_hash::ChainBaseline (see chunk_hash.h); the -m flags for this file are in
// common/CMakeLists.txt.
#define KVTIER_CHAIN_FN ChainBaseline
#include "chunk_hash_impl.inc"
