// libFuzzer entry of the batch target (targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lfc::fuzz::batch(data, size);
  return 0;
}
