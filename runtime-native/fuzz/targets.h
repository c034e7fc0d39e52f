// Fuzz targets of the native loaders: one function per loader, fed raw bytes. libFuzzer's entry
// points (fuzz_<target>.cc) and the g++ replay driver (replay.cc) call the same functions.
//
//   plan     parseProgram: the program JSON of a plan (programs/<id>.json), with the plan's symbols
//   batch    Runtime::setMicrobatch: a microbatch's fields, as batch files and the data loader hand
//            them over, into a runtime of a real program (programs/*.json beside this file)
//   params   Runtime::initParams: each param's init string, global shape, shard or piece index, as
//            the plan and a checkpoint's sharding give them
//
// The property every target checks: the loader accepts, or throws lfc::ProgramError /
// lfc::RuntimeError whose message is one non-empty line. Any other exception, a message of several
// lines, a crash or a sanitizer report is a finding (abort()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lfc::fuzz {

// The directory holding the programs the batch and params targets load (programs/<name>.json):
// LFC_FUZZ_PROGRAMS, else the directory this harness was built from.
std::string programsDir();

void plan(const uint8_t* data, size_t size);
void batch(const uint8_t* data, size_t size);
void params(const uint8_t* data, size_t size);

}  // namespace lfc::fuzz
