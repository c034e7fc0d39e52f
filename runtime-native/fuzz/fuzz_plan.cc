// libFuzzer entry of the plan target (targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lfc::fuzz::plan(data, size);
  return 0;
}
