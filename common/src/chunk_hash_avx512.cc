// chunk_hash::ChainAvx512 (see chunk_hash.h); the -m flags for this file are in
// common/CMakeLists.txt.
#define KVTIER_CHAIN_FN ChainAvx512
#include "chunk_hash_impl.inc"
