// Node bindings of the runtime (N-API through node-addon-api): class Runtime and the schema
// constants. runtime/native.ts declares the TypeScript types of everything exported here.
// Argument errors throw TypeError/Error naming the argument; runtime errors carry the core's
// message unchanged.
#include <cblas.h>
#include <napi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/copy.h"
#include "comm/sum.h"
#include "core/error.h"
#include "runtime.h"

namespace {

using lfc::cat;

// ---- argument conversion ---------------------------------------------------------------------

double number(const Napi::Value& v, const std::string& what) {
  if (!v.IsNumber()) throw Napi::TypeError::New(v.Env(), what + " must be a number");
  return v.As<Napi::Number>().DoubleValue();
}

int64_t integer(const Napi::Value& v, const std::string& what) {
  const double d = number(v, what);
  if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9007199254740991.0)
    throw Napi::TypeError::New(v.Env(), cat(what, " must be an integer, got ", d));
  return int64_t(d);
}

uint64_t seedOf(const Napi::Value& v, const std::string& what) {
  const int64_t s = integer(v, what);
  if (s < 0) throw Napi::TypeError::New(v.Env(), what + " must be ≥ 0");
  return uint64_t(s);
}

std::string string(const Napi::Value& v, const std::string& what) {
  if (!v.IsString()) throw Napi::TypeError::New(v.Env(), what + " must be a string");
  return v.As<Napi::String>().Utf8Value();
}

Napi::Object object(const Napi::Value& v, const std::string& what) {
  if (!v.IsObject()) throw Napi::TypeError::New(v.Env(), what + " must be an object");
  return v.As<Napi::Object>();
}

template <typename T>
std::vector<T> typedArray(const Napi::Value& v, napi_typedarray_type type, const std::string& what,
                          const char* typeName) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != type)
    throw Napi::TypeError::New(v.Env(), what + " must be a " + typeName);
  auto a = v.As<Napi::TypedArrayOf<T>>();
  return std::vector<T>(a.Data(), a.Data() + a.ElementLength());
}

template <typename T>
Napi::TypedArrayOf<T> toTyped(Napi::Env env, const std::vector<T>& values) {
  auto a = Napi::TypedArrayOf<T>::New(env, values.size());
  if (!values.empty()) std::memcpy(a.Data(), values.data(), values.size() * sizeof(T));
  return a;
}

std::vector<lfc::Grid> gridsOf(const Napi::Value& v, const std::string& what) {
  const std::vector<int32_t> g = typedArray<int32_t>(v, napi_int32_array, what, "Int32Array");
  if (g.size() % 3) throw Napi::TypeError::New(v.Env(), what + " must hold (t, h, w) triples");
  std::vector<lfc::Grid> out;
  for (size_t i = 0; i < g.size(); i += 3) out.push_back(lfc::Grid{g[i], g[i + 1], g[i + 2]});
  return out;
}

// grids as the flat (t, h, w) triples JS sees
Napi::TypedArrayOf<int32_t> gridsToJs(Napi::Env env, const std::vector<lfc::Grid>& grids) {
  std::vector<int32_t> g;
  for (const lfc::Grid& grid : grids)
    for (int64_t x : {grid.t, grid.h, grid.w}) g.push_back(int32_t(x));
  return toTyped(env, g);
}

lfc::Microbatch microbatchOf(const Napi::Value& v, const std::string& what) {
  const Napi::Object o = object(v, what);
  lfc::Microbatch mb;
  mb.tokens = typedArray<int32_t>(o.Get("tokens"), napi_int32_array, what + ".tokens", "Int32Array");
  mb.labels = typedArray<int32_t>(o.Get("labels"), napi_int32_array, what + ".labels", "Int32Array");
  mb.lossMask = typedArray<uint8_t>(o.Get("lossMask"), napi_uint8_array, what + ".lossMask", "Uint8Array");
  mb.positions = typedArray<int32_t>(o.Get("positions"), napi_int32_array, what + ".positions", "Int32Array");
  mb.segments = typedArray<int32_t>(o.Get("segments"), napi_int32_array, what + ".segments", "Int32Array");
  const Napi::Value caption = o.Get("captionMask");
  if (!caption.IsUndefined() && !caption.IsNull())
    mb.captionMask = typedArray<uint8_t>(caption, napi_uint8_array, what + ".captionMask", "Uint8Array");
  const Napi::Value images = o.Get("images");
  if (!images.IsArray()) throw Napi::TypeError::New(v.Env(), what + ".images must be an array");
  const auto list = images.As<Napi::Array>();
  for (uint32_t i = 0; i < list.Length(); i++) {
    const std::string w = cat(what, ".images[", i, "]");
    const Napi::Object im = object(list.Get(i), w);
    lfc::Image image;
    image.height = integer(im.Get("height"), w + ".height");
    image.width = integer(im.Get("width"), w + ".width");
    image.pixels = typedArray<float>(im.Get("pixels"), napi_float32_array, w + ".pixels", "Float32Array");
    mb.images.push_back(std::move(image));
  }
  // the contract's other form of images: patches and each image's grid (t, h, w)
  const Napi::Value pixels = o.Get("pixelValues");
  if (!pixels.IsUndefined() && !pixels.IsNull())
    mb.pixelValues = typedArray<float>(pixels, napi_float32_array, what + ".pixelValues", "Float32Array");
  const Napi::Value grids = o.Get("grids");
  if (!grids.IsUndefined() && !grids.IsNull()) mb.grids = gridsOf(grids, what + ".grids");
  const Napi::Value windows = o.Get("windowSegments");
  if (!windows.IsUndefined() && !windows.IsNull())
    mb.windowSegments = typedArray<int32_t>(windows, napi_int32_array, what + ".windowSegments", "Int32Array");
  const Napi::Value token = o.Get("imageTokenId");
  if (!token.IsUndefined() && !token.IsNull()) mb.imageTokenId = int32_t(integer(token, what + ".imageTokenId"));
  return mb;
}

Napi::Object microbatchToJs(Napi::Env env, const lfc::Microbatch& mb) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("tokens", toTyped(env, mb.tokens));
  o.Set("labels", toTyped(env, mb.labels));
  o.Set("lossMask", toTyped(env, mb.lossMask));
  o.Set("positions", toTyped(env, mb.positions));
  o.Set("segments", toTyped(env, mb.segments));
  o.Set("captionMask", toTyped(env, lfc::captionMask(mb)));
  Napi::Array images = Napi::Array::New(env, mb.images.size());
  for (size_t i = 0; i < mb.images.size(); i++) {
    Napi::Object im = Napi::Object::New(env);
    im.Set("height", double(mb.images[i].height));
    im.Set("width", double(mb.images[i].width));
    im.Set("pixels", toTyped(env, mb.images[i].pixels));
    images.Set(uint32_t(i), im);
  }
  o.Set("images", images);
  if (!mb.grids.empty() || !mb.pixelValues.empty()) {
    o.Set("pixelValues", toTyped(env, mb.pixelValues));
    o.Set("grids", gridsToJs(env, mb.grids));
  }
  if (!mb.windowSegments.empty()) o.Set("windowSegments", toTyped(env, mb.windowSegments));
  if (mb.imageTokenId >= 0) o.Set("imageTokenId", double(mb.imageTokenId));
  return o;
}

Napi::Object stepResultToJs(Napi::Env env, const lfc::StepResult& r, bool timing) {
  Napi::Object o = Napi::Object::New(env);
  Napi::Array outputs = Napi::Array::New(env, r.outputs.size());
  for (size_t i = 0; i < r.outputs.size(); i++) {
    Napi::Object e = Napi::Object::New(env);
    e.Set("name", r.outputs[i].name);
    e.Set("microbatch", r.outputs[i].microbatch);
    e.Set("value", r.outputs[i].value);
    outputs.Set(uint32_t(i), e);
  }
  o.Set("outputs", outputs);
  Napi::Object scalars = Napi::Object::New(env);
  for (const auto& [name, value] : r.scalars) scalars.Set(name, value);
  o.Set("scalars", scalars);
  o.Set("instructionsRun", r.instructionsRun);
  o.Set("stepMs", r.stepMs);
  // what the step's memory held: regions allocated whole, scratch at its per-stream high-water
  Napi::Object memory = Napi::Object::New(env);
  memory.Set("regionBytes", double(r.regionBytes));
  memory.Set("hostBytes", double(r.hostBytes));
  Napi::Object scratch = Napi::Object::New(env);
  int64_t scratchTotal = 0;
  for (int s = 0; s < lfc::kStreamCount; s++) {
    scratch.Set(lfc::schema::kStreams[s], double(r.scratchHighBytes[size_t(s)]));
    scratchTotal += r.scratchHighBytes[size_t(s)];
  }
  memory.Set("scratchHighBytes", scratch);
  memory.Set("deviceHighBytes", double(r.regionBytes + scratchTotal));
  o.Set("memory", memory);
  if (timing) {
    o.Set("startWallMs", r.startWallMs);
    Napi::Array t = Napi::Array::New(env, r.timing.size());
    for (size_t i = 0; i < r.timing.size(); i++) {
      Napi::Object e = Napi::Object::New(env);
      e.Set("start", r.timing[i].startMs);
      e.Set("end", r.timing[i].endMs);
      t.Set(uint32_t(i), e);
    }
    o.Set("perInstruction", t);
  }
  return o;
}

// ---- the step on a worker thread ---------------------------------------------------------------

class StepWorker : public Napi::AsyncWorker {
 public:
  StepWorker(Napi::Env env, std::shared_ptr<lfc::Runtime> rt, lfc::StepParams params)
      : Napi::AsyncWorker(env, "lfc.step"),
        rt_(std::move(rt)),
        params_(params),
        deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise promise() const { return deferred_.Promise(); }

  void Execute() override {
    try {
      result_ = rt_->runStep(params_);
    } catch (const lfc::CollectiveStepError& e) {
      inCollective_ = true;
      SetError(e.what());
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  // back on the JS thread: the step ends when its promise settles
  void OnOK() override {
    rt_->endStep();
    deferred_.Resolve(stepResultToJs(Env(), result_, rt_->options().timing));
  }
  void OnError(const Napi::Error& e) override {
    rt_->endStep();
    // a failure of the run (a collective's check, another rank's failure), not of lfc: the error's
    // `collective` says so (runtime/native.ts)
    if (inCollective_) e.Value().Set("collective", true);
    deferred_.Reject(e.Value());
  }

 private:
  std::shared_ptr<lfc::Runtime> rt_;  // alive until the step ends, whatever JS does meanwhile
  bool inCollective_ = false;
  lfc::StepParams params_;
  lfc::StepResult result_;
  Napi::Promise::Deferred deferred_;
};

// ---- multi-rank: the connect config and blocking calls on a worker thread ----------------------

std::vector<int> intList(const Napi::Value& v, const std::string& what) {
  if (!v.IsArray()) throw Napi::TypeError::New(v.Env(), what + " must be an array");
  std::vector<int> out;
  const auto a = v.As<Napi::Array>();
  for (uint32_t i = 0; i < a.Length(); i++) out.push_back(int(integer(a.Get(i), cat(what, "[", i, "]"))));
  return out;
}

int streamIndex(const Napi::Value& v, const std::string& what) {
  const std::string name = string(v, what);
  if (name == "control") return lfc::comm::kControlStream;
  for (int s = 0; s < lfc::kStreamCount; s++)
    if (name == lfc::schema::kStreams[s]) return s;
  throw Napi::TypeError::New(v.Env(), cat(what, ": unknown stream '", name, "'"));
}

lfc::comm::Config commConfigOf(const Napi::Value& v) {
  const Napi::Object o = object(v, "config");
  lfc::comm::Config c;
  c.rank = int(integer(o.Get("rank"), "config.rank"));
  c.worldSize = int(integer(o.Get("worldSize"), "config.worldSize"));
  c.store = string(o.Get("store"), "config.store");
  c.prefix = string(o.Get("prefix"), "config.prefix");
  if (o.Has("host") && !o.Get("host").IsUndefined()) c.host = string(o.Get("host"), "config.host");
  if (o.Has("timeoutMs") && !o.Get("timeoutMs").IsUndefined())
    c.timeout = std::chrono::milliseconds(integer(o.Get("timeoutMs"), "config.timeoutMs"));
  if (c.worldSize < 1 || c.rank < 0 || c.rank >= c.worldSize)
    throw Napi::TypeError::New(v.Env(), cat("config: rank ", c.rank, " of world size ", c.worldSize));
  const Napi::Value groups = o.Get("groups");
  if (!groups.IsArray()) throw Napi::TypeError::New(v.Env(), "config.groups must be an array");
  for (uint32_t i = 0; i < groups.As<Napi::Array>().Length(); i++) {
    const std::string w = cat("config.groups[", i, "]");
    const Napi::Object g = object(groups.As<Napi::Array>().Get(i), w);
    c.groups.push_back({string(g.Get("name"), w + ".name"), intList(g.Get("ranks"), w + ".ranks")});
  }
  const Napi::Object kinds = object(o.Get("rankGroups"), "config.rankGroups");
  const Napi::Array names = kinds.GetPropertyNames();
  for (uint32_t i = 0; i < names.Length(); i++) {
    const std::string kind = names.Get(i).As<Napi::String>().Utf8Value();
    std::vector<int> list = intList(kinds.Get(kind), "config.rankGroups." + kind);
    if (int(list.size()) != c.worldSize)
      throw Napi::TypeError::New(v.Env(), cat("config.rankGroups.", kind, " has ", list.size(), " entries for ",
                                              c.worldSize, " ranks"));
    // -1: the rank is in no group of this kind (a middle pipeline stage has no embd group)
    for (int g : list)
      if (g < -1 || g >= int(c.groups.size()))
        throw Napi::TypeError::New(v.Env(), cat("config.rankGroups.", kind, " names group ", g, " of ", c.groups.size()));
    c.rankGroups[kind] = std::move(list);
  }
  const Napi::Value contexts = o.Get("contexts");
  if (!contexts.IsArray()) throw Napi::TypeError::New(v.Env(), "config.contexts must be an array");
  for (uint32_t i = 0; i < contexts.As<Napi::Array>().Length(); i++) {
    const std::string w = cat("config.contexts[", i, "]");
    const Napi::Object e = object(contexts.As<Napi::Array>().Get(i), w);
    c.contexts.push_back({int(integer(e.Get("group"), w + ".group")), streamIndex(e.Get("stream"), w + ".stream")});
  }
  return c;
}

// Runs `work` on a libuv worker (it may block on other ranks), then settles a promise with what
// `done` makes of it on the JS thread.
class TaskWorker : public Napi::AsyncWorker {
 public:
  TaskWorker(Napi::Env env, const char* name, std::function<void()> work,
             std::function<Napi::Value(Napi::Env)> done, std::function<void()> settle)
      : Napi::AsyncWorker(env, name),
        work_(std::move(work)),
        done_(std::move(done)),
        settle_(std::move(settle)),
        deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise promise() const { return deferred_.Promise(); }
  void Execute() override {
    try {
      work_();
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override {
    settle_();
    deferred_.Resolve(done_(Env()));
  }
  void OnError(const Napi::Error& e) override {
    settle_();
    deferred_.Reject(e.Value());
  }

 private:
  std::function<void()> work_;
  std::function<Napi::Value(Napi::Env)> done_;
  std::function<void()> settle_;
  Napi::Promise::Deferred deferred_;
};

// ---- class Runtime -----------------------------------------------------------------------------

class RuntimeWrap : public Napi::ObjectWrap<RuntimeWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Runtime",
                       {
                           InstanceMethod<&RuntimeWrap::region>("region"),
                           InstanceMethod<&RuntimeWrap::initParams>("initParams"),
                           InstanceMethod<&RuntimeWrap::setMicrobatch>("setMicrobatch"),
                           InstanceMethod<&RuntimeWrap::synthesize>("synthesize"),
                           InstanceMethod<&RuntimeWrap::getMicrobatch>("getMicrobatch"),
                           InstanceMethod<&RuntimeWrap::captionMask>("captionMask"),
                           InstanceMethod<&RuntimeWrap::setScalar>("setScalar"),
                           InstanceMethod<&RuntimeWrap::getScalar>("getScalar"),
                           InstanceMethod<&RuntimeWrap::readBuffer>("readBuffer"),
                           InstanceMethod<&RuntimeWrap::info>("info"),
                           InstanceMethod<&RuntimeWrap::step>("step"),
                           InstanceMethod<&RuntimeWrap::connect>("connect"),
                           InstanceMethod<&RuntimeWrap::worldSum>("worldSum"),
                       });
  }

  explicit RuntimeWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<RuntimeWrap>(info) {
    const std::string text = string(info[0], "programJson");
    lfc::RuntimeOptions opts;
    if (info.Length() > 1 && !info[1].IsUndefined()) {
      const Napi::Object o = object(info[1], "options");
      if (o.Has("threads") && !o.Get("threads").IsUndefined())
        opts.threads = int(integer(o.Get("threads"), "options.threads"));
      if (o.Has("patchSize") && !o.Get("patchSize").IsUndefined())
        opts.patchSize = int(integer(o.Get("patchSize"), "options.patchSize"));
      if (o.Has("mergeSize") && !o.Get("mergeSize").IsUndefined())
        opts.mergeSize = int(integer(o.Get("mergeSize"), "options.mergeSize"));
      const auto optionalInt = [&](const char* key, int& out) {
        if (o.Has(key) && !o.Get(key).IsUndefined()) out = int(integer(o.Get(key), lfc::cat("options.", key)));
      };
      optionalInt("temporalPatch", opts.temporalPatch);
      optionalInt("windowMerged", opts.windowMerged);
      optionalInt("tableSide", opts.tableSide);
      optionalInt("imageTokenId", opts.imageTokenId);
      optionalInt("positionRows", opts.positionRows);
      if (o.Has("timing") && !o.Get("timing").IsUndefined()) opts.timing = o.Get("timing").ToBoolean();
      if (o.Has("collectives") && !o.Get("collectives").IsUndefined())
        opts.collectives = o.Get("collectives").ToBoolean();
      if (o.Has("symbols") && !o.Get("symbols").IsUndefined()) {
        const Napi::Value symbols = o.Get("symbols");
        if (!symbols.IsArray()) throw Napi::TypeError::New(info.Env(), "options.symbols must be an array");
        for (uint32_t i = 0; i < symbols.As<Napi::Array>().Length(); i++) {
          const std::string w = lfc::cat("options.symbols[", i, "]");
          const Napi::Object e = object(symbols.As<Napi::Array>().Get(i), w);
          opts.symbols.push_back({string(e.Get("name"), w + ".name"), integer(e.Get("bound"), w + ".bound")});
        }
      }
    }
    rt_ = std::make_shared<lfc::Runtime>(text, opts);
  }

 private:
  Napi::Value region(const Napi::CallbackInfo& info) {
    const std::string name = string(info[0], "region name");
    int r = -1;
    for (int k = 0; k < lfc::kRegionCount; k++)
      if (name == lfc::kRegionNames[k]) r = k;
    if (r < 0) throw Napi::Error::New(info.Env(), cat("unknown region '", name, "'"));
    auto* keep = new std::shared_ptr<lfc::Memory>(rt_->memory());  // owned by the ArrayBuffer
    std::byte* data = (*keep)->region(lfc::Region(r));
    const size_t size = size_t((*keep)->regionSize(lfc::Region(r)));
    return Napi::ArrayBuffer::New(
        info.Env(), data, size,
        [](Napi::Env, void*, std::shared_ptr<lfc::Memory>* hint) { delete hint; }, keep);
  }

  Napi::Value initParams(const Napi::CallbackInfo& info) {
    const uint64_t seed = seedOf(info[0], "seed");
    if (!info[1].IsArray()) throw Napi::TypeError::New(info.Env(), "params must be an array");
    const auto list = info[1].As<Napi::Array>();
    std::vector<lfc::ParamInit> params;
    for (uint32_t i = 0; i < list.Length(); i++) {
      const std::string w = cat("params[", i, "]");
      const Napi::Object o = object(list.Get(i), w);
      lfc::ParamInit p;
      p.name = string(o.Get("name"), w + ".name");
      p.init = string(o.Get("init"), w + ".init");
      const Napi::Value shape = o.Get("shape");
      if (!shape.IsArray()) throw Napi::TypeError::New(info.Env(), w + ".shape must be an array");
      for (uint32_t d = 0; d < shape.As<Napi::Array>().Length(); d++)
        p.shape.push_back(integer(shape.As<Napi::Array>().Get(d), w + ".shape"));
      const Napi::Value shard = o.Get("shard");
      if (!shard.IsUndefined() && !shard.IsNull()) {
        if (!shard.IsArray()) throw Napi::TypeError::New(info.Env(), w + ".shard must be an array");
        std::vector<std::pair<int64_t, int64_t>> s;
        for (uint32_t d = 0; d < shard.As<Napi::Array>().Length(); d++) {
          const Napi::Value pair = shard.As<Napi::Array>().Get(d);
          if (!pair.IsArray() || pair.As<Napi::Array>().Length() != 2)
            throw Napi::TypeError::New(info.Env(), w + ".shard must hold [start, length] pairs");
          s.emplace_back(integer(pair.As<Napi::Array>().Get(0u), w + ".shard"),
                         integer(pair.As<Napi::Array>().Get(1u), w + ".shard"));
        }
        p.shard = s;
      }
      const Napi::Value key = o.Get("key");
      if (!key.IsUndefined() && !key.IsNull()) p.key = string(key, w + ".key");
      const Napi::Value index = o.Get("index");
      if (!index.IsUndefined() && !index.IsNull()) {
        if (!index.IsArray()) throw Napi::TypeError::New(info.Env(), w + ".index must be an array");
        std::vector<std::vector<int64_t>> ix;
        for (uint32_t d = 0; d < index.As<Napi::Array>().Length(); d++) {
          const Napi::Value list = index.As<Napi::Array>().Get(d);
          if (!list.IsArray()) throw Napi::TypeError::New(info.Env(), w + ".index must hold lists");
          ix.emplace_back();
          for (uint32_t i = 0; i < list.As<Napi::Array>().Length(); i++)
            ix.back().push_back(integer(list.As<Napi::Array>().Get(i), w + ".index"));
        }
        p.index = ix;
      }
      params.push_back(std::move(p));
    }
    rt_->initParams(seed, params);
    return info.Env().Undefined();
  }

  Napi::Value setMicrobatch(const Napi::CallbackInfo& info) {
    const int slot = int(integer(info[0], "slot"));
    rt_->setMicrobatch(slot, microbatchOf(info[1], "microbatch"));
    return info.Env().Undefined();
  }

  Napi::Value synthesize(const Napi::CallbackInfo& info) {
    lfc::SynthArgs a;
    const int slot = int(integer(info[0], "slot"));
    a.seed = seedOf(info[1], "seed");
    a.step = integer(info[2], "step");
    a.globalMicrobatch = integer(info[3], "globalMicrobatch");
    const Napi::Object o = object(info[4], "options");
    a.seqLength = integer(o.Get("seqLength"), "options.seqLength");
    a.vocab = integer(o.Get("vocab"), "options.vocab");
    if (o.Has("maxVisualTokens") && !o.Get("maxVisualTokens").IsUndefined())
      a.maxVisualTokens = integer(o.Get("maxVisualTokens"), "options.maxVisualTokens");
    return microbatchToJs(info.Env(), rt_->synthesize(slot, a));
  }

  Napi::Value getMicrobatch(const Napi::CallbackInfo& info) {
    return microbatchToJs(info.Env(), rt_->microbatch(int(integer(info[0], "slot"))));
  }

  Napi::Value captionMask(const Napi::CallbackInfo& info) {
    return toTyped(info.Env(), rt_->captionMask(int(integer(info[0], "slot"))));
  }

  Napi::Value setScalar(const Napi::CallbackInfo& info) {
    rt_->setScalar(string(info[0], "name"), number(info[1], "value"));
    return info.Env().Undefined();
  }

  Napi::Value getScalar(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), rt_->scalar(string(info[0], "name")));
  }

  Napi::Value readBuffer(const Napi::CallbackInfo& info) {
    const std::vector<std::byte> bytes = rt_->readBuffer(int(integer(info[0], "buffer id")));
    auto out = Napi::ArrayBuffer::New(info.Env(), bytes.size());
    if (!bytes.empty()) std::memcpy(out.Data(), bytes.data(), bytes.size());
    return out;
  }

  Napi::Value info(const Napi::CallbackInfo& info) {
    const lfc::Program& p = rt_->program();
    Napi::Env env = info.Env();
    Napi::Object o = Napi::Object::New(env);
    o.Set("id", p.id);
    o.Set("slots", p.slots);
    o.Set("buffers", double(p.buffers.size()));
    o.Set("instructions", double(p.instrs.size()));
    o.Set("events", p.events);
    Napi::Array streams = Napi::Array::New(env);
    for (int s = 0; s < lfc::kStreamCount; s++)
      if (!p.streamInstrs[size_t(s)].empty()) streams.Set(streams.Length(), lfc::schema::kStreams[s]);
    o.Set("streams", streams);
    Napi::Object regions = Napi::Object::New(env);
    for (int r = 0; r < lfc::kRegionCount; r++) regions.Set(lfc::kRegionNames[r], double(p.regionBytes[size_t(r)]));
    o.Set("regions", regions);
    if (const lfc::comm::Backend* backend = rt_->backend()) {
      Napi::Array comms = Napi::Array::New(env);
      for (const lfc::comm::Communicator* c : backend->communicators()) {
        Napi::Object e = Napi::Object::New(env);
        e.Set("name", c->name());
        e.Set("size", c->size());
        e.Set("transport", c->transport());
        e.Set("direct", c->direct());
        comms.Set(comms.Length(), e);
      }
      o.Set("communicators", comms);
    }
    return o;
  }

  Napi::Value step(const Napi::CallbackInfo& info) {
    const Napi::Object o = object(info[0], "options");
    lfc::StepParams params;
    params.lr = number(o.Get("lr"), "options.lr");
    params.step = integer(o.Get("step"), "options.step");
    params.forwardOnly = o.Has("forwardOnly") && o.Get("forwardOnly").ToBoolean().Value();
    rt_->beginStep();
    try {
      auto* worker = new StepWorker(info.Env(), rt_, params);  // deletes itself after OnOK/OnError
      Napi::Promise promise = worker->promise();
      worker->Queue();
      return promise;
    } catch (...) {
      rt_->endStep();
      throw;
    }
  }

  // Both block on the other ranks, so they run on a worker thread and hold the runtime's step mark
  // meanwhile: no step or data call overlaps them.
  Napi::Value connect(const Napi::CallbackInfo& info) {
    const lfc::comm::Config config = commConfigOf(info[0]);
    return blocking(info.Env(), "lfc.connect", [rt = rt_, config] { rt->connect(config); },
                    [](Napi::Env env) { return env.Undefined(); });
  }

  Napi::Value worldSum(const Napi::CallbackInfo& info) {
    auto values = std::make_shared<std::vector<double>>(
        typedArray<double>(info[0], napi_float64_array, "values", "Float64Array"));
    return blocking(
        info.Env(), "lfc.worldSum", [rt = rt_, values] { *values = rt->worldSum(*values); },
        [values](Napi::Env env) { return toTyped(env, *values); });
  }

  Napi::Value blocking(Napi::Env env, const char* name, std::function<void()> work,
                       std::function<Napi::Value(Napi::Env)> done) {
    rt_->beginStep();
    try {
      auto* worker = new TaskWorker(env, name, std::move(work), std::move(done), [rt = rt_] { rt->endStep(); });
      Napi::Promise promise = worker->promise();
      worker->Queue();
      return promise;
    } catch (...) {
      rt_->endStep();
      throw;
    }
  }

  std::shared_ptr<lfc::Runtime> rt_;
};


// ropeIndex(tokens, segments, grids, imageTokenId, mergeSize) → Int32Array (3·S): M-RoPE ids
Napi::Value RopeIndex(const Napi::CallbackInfo& info) {
  try {
    return toTyped(info.Env(), lfc::ropeIndex(typedArray<int32_t>(info[0], napi_int32_array, "tokens", "Int32Array"),
                                              typedArray<int32_t>(info[1], napi_int32_array, "segments", "Int32Array"),
                                              gridsOf(info[2], "grids"), int32_t(integer(info[3], "imageTokenId")),
                                              integer(info[4], "mergeSize")));
  } catch (const lfc::RuntimeError& e) {
    throw Napi::Error::New(info.Env(), e.what());
  }
}

// windowSegments(grids, mergeSize, windowMerged) → Int32Array (N): each patch's window
Napi::Value WindowSegments(const Napi::CallbackInfo& info) {
  try {
    return toTyped(info.Env(), lfc::windowSegments(gridsOf(info[0], "grids"), integer(info[1], "mergeSize"),
                                                   integer(info[2], "windowMerged")));
  } catch (const lfc::RuntimeError& e) {
    throw Napi::Error::New(info.Env(), e.what());
  }
}

// patchify(microbatch, patchSize, mergeSize, temporalPatch) → {pixelValues, grids}: its images cut
// into the contract's patches (data/microbatch.h)
Napi::Value Patchify(const Napi::CallbackInfo& info) {
  try {
    const lfc::Microbatch mb = microbatchOf(info[0], "microbatch");
    const lfc::Patches p = lfc::patchify(mb.images, integer(info[1], "patchSize"), integer(info[2], "mergeSize"),
                                         integer(info[3], "temporalPatch"));
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("pixelValues", toTyped(info.Env(), p.values));
    o.Set("grids", gridsToJs(info.Env(), p.grids));
    return o;
  } catch (const lfc::RuntimeError& e) {
    throw Napi::Error::New(info.Env(), e.what());
  }
}

// sgemmGflops(n, threads, reps) → the best GFLOP/s of `reps` timed cblas_sgemm calls C = A·B at
// n×n×n on `threads` OpenBLAS threads, after one untimed call (bench/mfu.ts: this machine's
// peak under the kernels blasCore names). It leaves OpenBLAS at `threads` threads; a Runtime sets
// its own count when it is made.
Napi::Value SgemmGflops(const Napi::CallbackInfo& info) {
  const int64_t n = integer(info[0], "n"), threads = integer(info[1], "threads"),
                reps = integer(info[2], "reps");
  if (n < 1 || n > 16384 || threads < 1 || reps < 1)
    throw Napi::RangeError::New(info.Env(), "sgemmGflops: n in 1..16384, threads and reps ≥ 1");
  std::vector<float> a(size_t(n * n)), b(size_t(n * n)), c(size_t(n * n));
  for (size_t i = 0; i < a.size(); i++) {
    a[i] = float(i % 13) * 0.01f - 0.06f;
    b[i] = float(i % 7) * 0.02f - 0.06f;
  }
  openblas_set_num_threads(int(threads));
  const int m = int(n);
  const auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, a.data(), m, b.data(), m,
                0.0f, c.data(), m);
  };
  gemm();
  double best = 0;
  for (int64_t r = 0; r < reps; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * double(n) * double(n) * double(n) / s / 1e9);
  }
  openblas_set_num_threads(1);  // back to lfc's setting: the runtime's gemms tile over its own pool
  return Napi::Number::New(info.Env(), best);
}

// The memory floor of the shared-memory all-reduce and reduce-scatter (bench/collectives.ts): P
// threads, each a rank with its own buffer of `bytes` f32, run the direct path's two phases with
// its kernels (comm/shm.cc): each sums block r of every buffer into its own, in place, in group
// order (a reduce-scatter is this alone), and then, at once, copies every other block from the
// buffer that summed it (the all-reduce's second phase). Between repeats a buffer twice the size of
// the inputs is swept, so the sums start from memory as the bench's do. The warm-up's result is
// checked against a plain sum. Returns the medians in ms, each phase timed from the threads'
// common start to the last one's end.
Napi::Value CollectiveFloor(const Napi::CallbackInfo& info) {
  const int64_t bytes = integer(info[0], "bytes"), P = integer(info[1], "ranks"),
                reps = integer(info[2], "reps");
  if (bytes < 4 * P || bytes > (int64_t(1) << 30) || P < 2 || P > 64 || reps < 1)
    throw Napi::RangeError::New(info.Env(), "collectiveFloor: bytes in 4·ranks..1 GiB, ranks in 2..64, reps ≥ 1");
  const int64_t count = bytes / 4 / P * P, block = count / P;
  std::vector<std::vector<float>> buffers(static_cast<size_t>(P), std::vector<float>(static_cast<size_t>(count)));
  for (int64_t r = 0; r < P; r++)
    for (int64_t i = 0; i < count; i++) buffers[size_t(r)][size_t(i)] = float((i + r) % 17) * 0.25f;
  std::vector<char> sweep(static_cast<size_t>(2 * P * bytes));
  std::atomic<int64_t> arrived{0};
  const auto barrier = [&](int64_t generation) {  // every thread's generation-th arrival
    arrived.fetch_add(1);
    while (arrived.load() < generation * P) std::this_thread::yield();
  };
  using Clock = std::chrono::steady_clock;
  std::vector<double> sumMs, copyMs;
  for (int64_t rep = 0; rep <= reps; rep++) {  // the first is a warm-up
    for (size_t i = 0; i < sweep.size(); i += 64) sweep[i] = char(sweep[i] + 1);
    arrived = 0;
    Clock::time_point start, summed, copied;
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < P; r++)
      threads.emplace_back([&, r] {
        std::vector<const float*> parts(static_cast<size_t>(P));
        for (int64_t j = 0; j < P; j++) parts[size_t(j)] = buffers[size_t(j)].data() + r * block;
        barrier(1);
        if (r == 0) start = Clock::now();
        barrier(2);
        lfc::comm::sumParts(buffers[size_t(r)].data() + r * block, parts.data(), int(P), block);
        barrier(3);
        if (r == 0) summed = Clock::now();
        barrier(4);
        for (int64_t j = 0; j < P; j++)
          if (j != r)
            lfc::comm::copyBlock(buffers[size_t(r)].data() + j * block, buffers[size_t(j)].data() + j * block,
                                 size_t(block) * sizeof(float));
        barrier(5);
        if (r == 0) copied = Clock::now();
      });
    for (auto& t : threads) t.join();
    if (rep == 0) {
      // the warm-up's result is every buffer's first values summed, in every buffer
      for (int64_t i = 0; i < count; i++) {
        float want = 0;
        for (int64_t j = 0; j < P; j++) want += float((i + j) % 17) * 0.25f;
        for (int64_t r = 0; r < P; r++)
          if (buffers[size_t(r)][size_t(i)] != want)
            throw Napi::Error::New(info.Env(), cat("collectiveFloor: rank ", r, " holds ", buffers[size_t(r)][size_t(i)],
                                                   " at ", i, ", not the sum ", want));
      }
      continue;
    }
    sumMs.push_back(std::chrono::duration<double, std::milli>(summed - start).count());
    copyMs.push_back(std::chrono::duration<double, std::milli>(copied - summed).count());
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  Napi::Object out = Napi::Object::New(info.Env());
  out.Set("sumMs", median(sumMs));
  out.Set("copyMs", median(copyMs));
  return out;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("Runtime", RuntimeWrap::Define(env));
  exports.Set("patchify", Napi::Function::New(env, Patchify, "patchify"));
  exports.Set("ropeIndex", Napi::Function::New(env, RopeIndex, "ropeIndex"));
  exports.Set("windowSegments", Napi::Function::New(env, WindowSegments, "windowSegments"));
  exports.Set("sgemmGflops", Napi::Function::New(env, SgemmGflops, "sgemmGflops"));
  exports.Set("collectiveFloor", Napi::Function::New(env, CollectiveFloor, "collectiveFloor"));
  exports.Set("planVersion", lfc::schema::kPlanVersion);
  // the kernels OpenBLAS runs (runtime/blas.ts names them through OPENBLAS_CORETYPE)
  exports.Set("blasCore", Napi::String::New(env, openblas_get_corename()));
  Napi::Array ops = Napi::Array::New(env);
  for (const char* name : lfc::schema::kOpNames) ops.Set(ops.Length(), name);
  exports.Set("opNames", ops);
  Napi::Array streams = Napi::Array::New(env);
  for (const char* name : lfc::schema::kStreams) streams.Set(streams.Length(), name);
  exports.Set("streams", streams);
  Napi::Array regions = Napi::Array::New(env);
  for (const char* name : lfc::schema::kRegions) regions.Set(regions.Length(), name);
  exports.Set("regions", regions);
  return exports;
}

}  // namespace

NODE_API_MODULE(lfc_native, Init)
