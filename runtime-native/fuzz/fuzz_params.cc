// libFuzzer entry of the params target (targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lfc::fuzz::params(data, size);
  return 0;
}
