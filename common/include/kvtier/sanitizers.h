// Annotations for ThreadSanitizer (make test-tsan) about orders it cannot see.
//
// The gRPC libraries kvtier links are not built with TSan, so TSan does not see how gRPC orders
// the steps of a call, e.g. a reactor's constructor before the reactions gRPC runs on its own
// threads. Where such an order covers kvtier's own fields, the code states it:
//   KVTIER_TSAN_RELEASE(p)  before handing `p` to gRPC (StartCall, StartRead, ...);
//   KVTIER_TSAN_ACQUIRE(p)  first thing in a reaction gRPC runs on `p`.
// Both compile to nothing outside TSan builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define KVTIER_TSAN_ENABLED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVTIER_TSAN_ENABLED 1
#endif
#endif

// KVTIER_ASAN_ENABLED: this is an AddressSanitizer build (make test-asan), whose
// shadow memory and quarantine make a process's RSS several times what it uses.
#if defined(__SANITIZE_ADDRESS__)
#define KVTIER_ASAN_ENABLED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVTIER_ASAN_ENABLED 1
#endif
#endif

#ifdef KVTIER_TSAN_ENABLED
#include <sanitizer/tsan_interface.h>
#define KVTIER_TSAN_RELEASE(addr) __tsan_release(static_cast<void*>(addr))
#define KVTIER_TSAN_ACQUIRE(addr) __tsan_acquire(static_cast<void*>(addr))
#else
#define KVTIER_TSAN_RELEASE(addr) static_cast<void>(0)
#define KVTIER_TSAN_ACQUIRE(addr) static_cast<void>(0)
#endif
