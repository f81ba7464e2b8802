// LLVMFuzzerInitialize for the targets whose code logs (NVMe tier, CacheCore): logging off,
// so that a run's output is libFuzzer's (a warning per corrupt image or refused request
// would otherwise cost more than the input itself).
#include "kvtier/logging.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)kvtier::SetLogLevel("off");
  return 0;
}
