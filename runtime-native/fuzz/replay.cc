// The replay driver: runs committed inputs through the fuzz targets (targets.h), built with the
// runtime's own compiler (g++), no libFuzzer. test/fuzz/native-replay.test.ts runs it on
// runtime-native/fuzz/corpus/<target>/ in npm test.
//
//   lfc_fuzz_replay <target> <file or directory>...   [LFC_FUZZ_TIMEOUT_S: per input, default 10]
//
// Exit 0 when every input is accepted or rejected with one line; a finding aborts (the input's
// path is printed first), a hang past the timeout exits 3.
#include <csignal>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

#include "targets.h"

namespace {

const char* current = "";  // the input being run, for the signal handlers

void onSignal(int sig) {
  const char* what = sig == SIGALRM ? "timeout" : strsignal(sig);
  // (async-signal-safe enough for a dying test driver)
  std::fprintf(stderr, "lfc_fuzz_replay: %s on %s\n", what, current);
  _exit(sig == SIGALRM ? 3 : 128 + sig);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: lfc_fuzz_replay plan|batch|params <file or directory>...\n");
    return 2;
  }
  const std::string target = argv[1];
  void (*run)(const uint8_t*, size_t) = target == "plan"     ? lfc::fuzz::plan
                                        : target == "batch"  ? lfc::fuzz::batch
                                        : target == "params" ? lfc::fuzz::params
                                                             : nullptr;
  if (!run) {
    std::fprintf(stderr, "lfc_fuzz_replay: unknown target '%s' (plan, batch, params)\n", target.c_str());
    return 2;
  }
  const char* t = std::getenv("LFC_FUZZ_TIMEOUT_S");
  const unsigned timeoutS = t ? unsigned(std::atoi(t)) : 10;
  std::vector<std::string> files;
  for (int i = 2; i < argc; i++) {
    namespace fs = std::filesystem;
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path().string());
    } else {
      files.push_back(argv[i]);
    }
  }
  std::sort(files.begin(), files.end());
  std::signal(SIGALRM, onSignal);
  std::signal(SIGSEGV, onSignal);
  std::signal(SIGABRT, onSignal);
  std::signal(SIGBUS, onSignal);
  std::signal(SIGFPE, onSignal);
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    current = f.c_str();
    alarm(timeoutS);
    run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    alarm(0);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("lfc_fuzz_replay: %s: %zu inputs, no finding, %.2f s\n", target.c_str(), files.size(), s);
  return 0;
}
