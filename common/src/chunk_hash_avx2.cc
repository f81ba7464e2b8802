// chunk_hash::ChainAvx2 (see chunk_hash.h); the -m flags for this file are in
// common/CMakeLists.txt.
#define KVTIER_CHAIN_FN ChainAvx2
#include "chunk_hash_impl.inc"
