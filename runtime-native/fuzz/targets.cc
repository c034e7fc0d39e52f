// The fuzz targets (targets.h). The batch and params targets decode their bytes into a structured
// input: mostly valid (the fields the program expects, at sizes that fit), with each field in turn
// dropped, resized or given extreme values, so the fuzzer reaches the checks past the first one.
#include "targets.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "runtime.h"

namespace lfc::fuzz {

namespace {

using nlohmann::json;

// A finding: print it and abort, so libFuzzer and the replay driver both stop on it.
[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "lfc fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

const bool kVerbose = std::getenv("LFC_FUZZ_VERBOSE") != nullptr;  // print each input's outcome

// A rejection must be one non-empty line.
void checkMessage(const char* kind, const char* what) {
  const std::string m = what;
  if (kVerbose) std::fprintf(stderr, "rejected: %s\n", what);
  if (m.empty()) finding(std::string(kind) + " with an empty message");
  if (m.find('\n') != std::string::npos) finding(std::string(kind) + " of several lines: " + m);
}

// Runs one input through a loader: the lfc errors are rejections; anything else is a finding.
template <typename F>
void guarded(F&& f) {
  try {
    f();
    if (kVerbose) std::fprintf(stderr, "accepted\n");
  } catch (const ProgramError& e) {
    checkMessage("ProgramError", e.what());
  } catch (const RuntimeError& e) {
    checkMessage("RuntimeError", e.what());
  } catch (const std::exception& e) {
    finding(std::string("an exception that is not an lfc error: ") + e.what());
  }
}

// Bytes read front to back; past the end every read gives 0.
struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() { return n ? (n--, *p++) : 0; }
  uint16_t u16() { return uint16_t(u8() | u8() << 8); }
  uint32_t u32() { return uint32_t(u16()) | uint32_t(u16()) << 16; }
  uint64_t u64() { return uint64_t(u32()) | uint64_t(u32()) << 32; }
  bool flag() { return u8() & 1; }
  // mostly small, sometimes any 32-bit value (negative, huge)
  int32_t smallInt(int32_t modulo) {
    const uint8_t b = u8();
    return b < 240 ? int32_t(b % modulo) : int32_t(u32());
  }
  float anyFloat() {
    const uint32_t bits = u32();
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  std::string text(size_t maxLength) {
    std::string s;
    for (size_t k = u8() % (maxLength + 1); k > 0 && n; k--) s += char(u8());
    return s;
  }
};

// A runtime of a committed program, and what the targets need to feed it.
struct Fixture {
  std::string name;
  RuntimeOptions options;
  std::unique_ptr<Runtime> runtime;
  std::vector<ParamInit> params;  // the plan's: each param's init string and global shape
};

std::vector<Fixture>& fixtures() {
  static std::vector<Fixture> all = [] {
    std::vector<Fixture> out;
    for (const char* name : {"tiny-vlm", "qwen2.5-vl-tiny"}) {
      const std::string path = programsDir() + "/" + name + ".json";
      std::ifstream in(path);
      if (!in) finding("cannot read " + path);
      const json j = json::parse(in);
      Fixture f;
      f.name = name;
      const json& o = j.at("options");
      f.options.patchSize = o.at("patchSize");
      f.options.mergeSize = o.at("mergeSize");
      f.options.temporalPatch = o.at("temporalPatch");
      f.options.windowMerged = o.at("windowMerged");
      f.options.tableSide = o.at("tableSide");
      f.options.imageTokenId = o.at("imageTokenId");
      f.options.positionRows = o.at("positionRows");
      f.options.threads = 1;
      for (const json& s : j.at("symbols")) f.options.symbols.push_back(SymbolDecl{s.at("name"), s.at("bound")});
      for (const json& p : j.at("params")) {
        ParamInit pi;
        pi.name = p.at("name");
        pi.init = p.at("init");
        pi.shape = p.at("shape").get<std::vector<int64_t>>();
        f.params.push_back(std::move(pi));
      }
      f.runtime = std::make_unique<Runtime>(j.at("program").dump(), f.options);
      out.push_back(std::move(f));
    }
    return out;
  }();
  return all;
}

int64_t product(std::initializer_list<int64_t> xs) {
  int64_t p = 1;
  for (int64_t x : xs) {
    if (x <= 0) return -1;
    if (__builtin_mul_overflow(p, x, &p)) return -1;
  }
  return p;
}

constexpr int64_t kMaxValues = 1 << 18;  // the most values the harness itself allocates for one field

}  // namespace

std::string programsDir() {
  if (const char* d = std::getenv("LFC_FUZZ_PROGRAMS")) return d;
  return LFC_FUZZ_SOURCE_DIR "/programs";
}

void plan(const uint8_t* data, size_t size) {
  Reader r{data, size};
  const uint8_t mode = r.u8();
  ParseOptions options;
  options.collectives = mode & 1;
  if (mode & 2) options.symbols = {{"S", 32}, {"Nv", 32}};
  if (mode & 4) options.symbols.push_back({"R", int64_t(r.u32())});
  const std::string text(reinterpret_cast<const char*>(r.p), r.n);
  guarded([&] { parseProgram(text, options); });
}

void batch(const uint8_t* data, size_t size) {
  Reader r{data, size};
  Fixture& f = fixtures()[r.u8() % fixtures().size()];
  Runtime& rt = *f.runtime;
  const VisionSpec spec = f.options.vision();
  Microbatch mb;
  const int slot = int(r.u8() % (rt.program().slots + 2)) - 1;
  const uint8_t valid = r.u8();  // which fields are made to fit (bit set: fits)
  const size_t S = r.u8() % 48;
  const auto ints = [&](size_t n, int32_t modulo) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = r.smallInt(modulo);
    return v;
  };
  const auto length = [&](bool fits, size_t want) { return fits ? want : size_t(r.u8()); };
  mb.tokens = ints(S, 40);
  mb.labels = ints(length(valid & 1, S), 40);
  mb.lossMask.resize(length(valid & 1, S));
  for (auto& x : mb.lossMask) x = r.u8();
  mb.segments = ints(length(valid & 1, S), 4);
  const uint8_t positions = r.u8() % 4;
  mb.positions = ints(positions == 0 ? S : positions == 1 ? 3 * S : size_t(r.u8()), 64);
  if (r.flag()) {
    mb.captionMask.resize(length(valid & 2, S));
    for (auto& x : mb.captionMask) x = r.u8();
  }
  // images [3, H, W], or patches with their grids (or both: refused)
  int64_t visual = 0;  // the visual tokens the images give, when every image fits
  const int64_t unit = int64_t(spec.patchSize) * spec.mergeSize;
  const uint8_t form = r.u8() % 4;
  if (form & 1) {
    for (int k = r.u8() % 3; k > 0; k--) {
      Image im;
      const uint8_t fits = r.u8();
      im.height = fits & 1 ? unit * (1 + r.u8() % 3) : int64_t(r.smallInt(40));
      im.width = fits & 2 ? unit * (1 + r.u8() % 3) : int64_t(r.smallInt(40));
      const int64_t n = product({3, im.height, im.width});
      im.pixels.resize(size_t(fits & 4 && n > 0 && n <= kMaxValues ? n : r.u8()));
      for (auto& x : im.pixels) x = r.flag() ? r.anyFloat() : 0.5f;
      if (im.height > 0 && im.width > 0 && im.height % unit == 0 && im.width % unit == 0)
        visual += (im.height / unit) * (im.width / unit);
      mb.images.push_back(std::move(im));
    }
  }
  if (form & 2) {
    int64_t patches = 0;
    for (int k = r.u8() % 3; k > 0; k--) {
      Grid g;
      const bool fits = r.flag();
      g.t = fits ? 1 : r.smallInt(4);
      g.h = fits ? spec.mergeSize * (1 + r.u8() % 4) : r.smallInt(12);
      g.w = fits ? spec.mergeSize * (1 + r.u8() % 4) : r.smallInt(12);
      const int64_t n = product({g.t, g.h, g.w});
      if (n > 0 && patches >= 0) patches += n;
      else patches = -1;
      mb.grids.push_back(g);
    }
    const int64_t n = patches >= 0 ? product({patches, spec.patchWidth()}) : -1;
    mb.pixelValues.resize(size_t(valid & 4 && n > 0 && n <= kMaxValues ? n : r.u8()));
    for (auto& x : mb.pixelValues) x = r.flag() ? r.anyFloat() : 0.25f;
    if (patches > 0) visual += patches / (int64_t(spec.mergeSize) * spec.mergeSize);
  }
  if (r.flag()) mb.windowSegments = ints(r.u8(), 8);
  if (r.flag()) mb.imageTokenId = r.smallInt(4) - 1;
  // as many placeholders as visual tokens, so the checks past that one are reached
  if (valid & 8) {
    for (auto& t : mb.tokens)
      if (t == kPlaceholderToken) t = kFillerToken;
    for (size_t i = 0; i < S && int64_t(i) < visual; i++) mb.tokens[i] = f.options.imageTokenId;
  }
  guarded([&] {
    rt.setMicrobatch(slot, std::move(mb));
    rt.captionMask(slot);
  });
}

void params(const uint8_t* data, size_t size) {
  Reader r{data, size};
  Fixture& f = fixtures()[r.u8() % fixtures().size()];
  const uint64_t seed = r.u64();
  std::vector<ParamInit> list;
  for (const ParamInit& p : f.params) {
    const uint8_t mode = r.u8();
    if (mode < 200) {  // as the plan gives it
      list.push_back(p);
      continue;
    }
    ParamInit q = p;
    switch (mode % 8) {
      case 0: continue;  // missing
      case 1: q.init = r.text(24); break;
      case 2:  // a dim changed, added or dropped
        if (r.flag() && !q.shape.empty()) q.shape[r.u8() % q.shape.size()] = int64_t(r.u64());
        else if (r.flag()) q.shape.push_back(r.smallInt(8));
        else if (!q.shape.empty()) q.shape.pop_back();
        break;
      case 3: {  // a shard given
        std::vector<std::pair<int64_t, int64_t>> shard;
        for (int64_t d : q.shape) shard.emplace_back(0, d);
        if (r.flag() || shard.empty()) shard.emplace_back(r.smallInt(8), r.smallInt(8));
        else shard[r.u8() % shard.size()] = {int64_t(r.u64()), int64_t(r.u64())};
        q.shard = shard;
        break;
      }
      case 4: {  // a piece: the whole tensor's index lists, one entry perturbed
        std::vector<std::vector<int64_t>> index;
        for (int64_t d : q.shape) {
          index.emplace_back();
          for (int64_t i = 0; i < d && i < kMaxValues; i++) index.back().push_back(i);
        }
        if (r.flag() && !index.empty() && !index[0].empty()) index[0][r.u8() % index[0].size()] = int64_t(r.u64());
        else if (r.flag()) index.emplace_back(size_t(r.u8() % 3), r.smallInt(4));
        else if (!index.empty()) index.pop_back();
        q.index = index;
        if (r.flag()) q.key = r.text(16);
        break;
      }
      case 5: list.push_back(p); break;  // given twice
      case 6: q.name = r.text(16); break;
      case 7: q.init = r.flag() ? "normal(" + r.text(8) + ")" : "normal(-1)"; break;
    }
    list.push_back(std::move(q));
  }
  guarded([&] { f.runtime->initParams(seed, list); });
}

}  // namespace lfc::fuzz
