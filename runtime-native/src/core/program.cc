#include "core/program.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <tuple>

#include "comm/collectives.h"
#include "core/error.h"
#include "ops/registry.h"

namespace lfc {

using nlohmann::json;

namespace {

constexpr const char* kProgramFormat = "lfc-program";

// Errors name the program and, inside an instruction, its index, op and scope.
struct Ctx {
  std::string program = "?";
  ParseOptions options;
  [[noreturn]] void fail(const std::string& msg) const {
    throw ProgramError("program " + program + ": " + msg);
  }
};

const json& field(const Ctx& c, const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) c.fail(where + " must be an object");
  auto it = obj.find(key);
  if (it == obj.end()) c.fail(where + " has no '" + key + "'");
  return *it;
}

int64_t asInt(const Ctx& c, const json& v, const std::string& what) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  c.fail(what + " must be an integer, got " + v.dump());
}

std::string asString(const Ctx& c, const json& v, const std::string& what) {
  if (!v.is_string()) c.fail(what + " must be a string, got " + v.dump());
  return v.get<std::string>();
}

std::string bufferText(const Program& p, int id) {
  return cat("buffer ", id, " (", p.buffers[size_t(id)].name, ")");
}

// The run-time symbols: the caller's (the plan's), then any the program declares.
void parseSymbols(const Ctx& c, const json& j, Program& p) {
  const auto declare = [&](const std::string& name, int64_t bound, const std::string& where) {
    try {
      p.symbols.declare(name, bound);
    } catch (const std::exception& e) {
      c.fail(cat(where, ": ", e.what()));
    }
  };
  for (const SymbolDecl& d : c.options.symbols) declare(d.name, d.bound, "the plan's symbols");
  if (!j.contains("symbols")) return;
  const json& list = j["symbols"];
  if (!list.is_array()) c.fail("'symbols' must be a list of {name, bound}");
  for (size_t i = 0; i < list.size(); i++) {
    const std::string where = cat("symbols[", i, "]");
    declare(asString(c, field(c, list[i], "name", where), where + ".name"),
            asInt(c, field(c, list[i], "bound", where), where + ".bound"), where);
  }
}

void parseBuffers(const Ctx& c, const json& j, Program& p) {
  const json& list = field(c, j, "buffers", "the program");
  if (!list.is_array()) c.fail("'buffers' must be a list");
  for (size_t i = 0; i < list.size(); i++) {
    const json& b = list[i];
    const std::string where = cat("buffers[", i, "]");
    Buffer buf;
    buf.id = int(asInt(c, field(c, b, "id", where), where + ".id"));
    if (buf.id != int(i)) c.fail(cat(where, " has id ", buf.id, "; ids must equal list positions"));
    buf.name = asString(c, field(c, b, "name", where), where + ".name");
    const std::string here = cat("buffer ", i, " (", buf.name, ")");
    const std::string region = asString(c, field(c, b, "region", where), here + ".region");
    bool inSchema = false;
    for (const char* r : schema::kRegions) inSchema = inSchema || region == r;
    int ri = -1;
    for (int r = 0; r < kRegionCount; r++)
      if (region == kRegionNames[r]) ri = r;
    if (!inSchema) c.fail(cat(here, " has unknown region '", region, "'"));
    if (ri < 0) c.fail(cat(here, ": region '", region, "' is not supported by this runtime"));
    buf.region = Region(ri);
    const std::string space = asString(c, field(c, b, "space", where), here + ".space");
    if (space != "device" && space != "host")
      c.fail(cat(here, " has unknown space '", space, "' (device or host)"));
    buf.host = space == "host";
    const std::string dtype = asString(c, field(c, b, "dtype", where), here + ".dtype");
    const auto dt = parseDType(dtype);
    if (!dt) c.fail(cat(here, " has unknown dtype '", dtype, "'"));
    buf.dtype = *dt;
    const json& shape = field(c, b, "shape", where);
    if (!shape.is_array()) c.fail(here + ".shape must be a list");
    for (const auto& d : shape) {
      std::string text;
      if (d.is_string()) text = d.get<std::string>();
      else if (d.is_number_integer()) text = std::to_string(d.get<int64_t>());
      else c.fail(cat(here, " has a dim that is neither a number nor a string: ", d.dump()));
      try {
        buf.shape.push_back(parseDim(text, p.symbols));
      } catch (const std::exception& e) {
        c.fail(cat(here, ": ", e.what()));
      }
      buf.symbolic = buf.symbolic || buf.shape.back().symbolic();
      buf.runTime = buf.runTime || SymbolTable::runTime(buf.shape.back().sym);
    }
    buf.offset = asInt(c, field(c, b, "offset", where), here + ".offset");
    buf.bytes = asInt(c, field(c, b, "bytes", where), here + ".bytes");
    if (buf.offset < 0 || buf.bytes < 0) c.fail(here + " has a negative offset or size");
    if (b.contains("viewOf") && !b["viewOf"].is_null())
      buf.viewOf = int(asInt(c, b["viewOf"], here + ".viewOf"));
    buf.microbatch = int(asInt(c, field(c, b, "microbatch", where), here + ".microbatch"));
    if (buf.microbatch < -1) c.fail(cat(here, " has microbatch ", buf.microbatch));
    p.buffers.push_back(std::move(buf));
  }
  const int n = int(p.buffers.size());
  for (Buffer& b : p.buffers) {
    const std::string here = bufferText(p, b.id);
    // views: follow to the owner of the bytes
    b.root = b.id;
    int hops = 0;
    while (p.buffers[size_t(b.root)].viewOf >= 0) {
      const int next = p.buffers[size_t(b.root)].viewOf;
      if (next >= n) c.fail(cat(here, " is a view of buffer ", next, ", out of range (", n, " buffers)"));
      if (++hops > n) c.fail(here + ": its views form a cycle");
      b.root = next;
    }
    const Buffer& root = p.buffers[size_t(b.root)];
    if (root.region != b.region)
      c.fail(cat(here, " in region ", regionName(b.region), " is a view of ", bufferText(p, root.id),
                 " in region ", regionName(root.region)));
    if (b.viewOf >= 0 && (b.offset != root.offset || b.bytes != root.bytes))
      c.fail(cat(here, " is a view of ", bufferText(p, root.id),
                 " but its offset and bytes differ from that buffer's"));
    // the kernels (and the host's typed views of persistent buffers) read whole elements
    if (b.offset % dtypeBytes(b.dtype) != 0)
      c.fail(cat(here, " starts at byte ", b.offset, ", not a multiple of its ", dtypeName(b.dtype), "'s ",
                 dtypeBytes(b.dtype), " bytes"));
    const int64_t limit = p.regionSize(b.region);
    if (b.offset + b.bytes > limit)
      c.fail(cat(here, " ends at byte ", b.offset + b.bytes, ", past its region ", regionName(b.region),
                 " of ", limit, " bytes"));
    if (b.symbolic && b.microbatch < 0)
      c.fail(cat(here, " has symbolic shape ", formatShape(b.shape),
                 " but belongs to no microbatch (microbatch −1), so nothing resolves it"));
    if (!b.symbolic) {
      const int64_t need = numel(resolveShape(b.shape, SymbolSizes{})) * dtypeBytes(b.dtype);
      if (need > b.bytes)
        c.fail(cat(here, ": ", dtypeName(b.dtype), formatShape(b.shape), " needs ", need,
                   " bytes, planned ", b.bytes));
    }
    if (b.region == Region::data && b.microbatch < 0)
      c.fail(here + " is a data buffer without a microbatch slot");
    if (b.region == Region::scratch) c.fail(here + " is in region scratch, which holds no buffers");
  }
  // the microbatch slots share one data block: their buffers must not overlap
  std::vector<const Buffer*> data;
  for (const Buffer& b : p.buffers)
    if (b.region == Region::data && b.viewOf < 0 && b.bytes > 0) data.push_back(&b);
  std::sort(data.begin(), data.end(), [](const Buffer* x, const Buffer* y) { return x->offset < y->offset; });
  for (size_t i = 1; i < data.size(); i++)
    if (data[i]->offset < data[i - 1]->offset + data[i - 1]->bytes && data[i]->microbatch != data[i - 1]->microbatch)
      c.fail(cat(bufferText(p, data[i]->id), " of microbatch ", data[i]->microbatch, " overlaps ",
                 bufferText(p, data[i - 1]->id), " of microbatch ", data[i - 1]->microbatch,
                 " in the data region (the slots share it)"));
}

int bufferRef(const Ctx& c, const Program& p, const json& v, const std::string& what) {
  const int64_t id = asInt(c, v, what);
  if (id < 0 || id >= int64_t(p.buffers.size()))
    c.fail(cat(what, ": buffer id ", id, " is out of range (", p.buffers.size(), " buffers)"));
  return int(id);
}

void parseParams(const Ctx& c, const json& j, Program& p) {
  const json& list = field(c, j, "params", "the program");
  if (!list.is_array()) c.fail("'params' must be a list");
  for (size_t i = 0; i < list.size(); i++) {
    const json& e = list[i];
    const std::string where = cat("params[", i, "]");
    ProgramParam pp;
    pp.name = asString(c, field(c, e, "name", where), where + ".name");
    const std::string here = cat("param ", pp.name);
    pp.buffer = bufferRef(c, p, field(c, e, "buffer", where), here + ".buffer");
    if (e.contains("grad")) pp.grad = bufferRef(c, p, e["grad"], here + ".grad");
    if (e.contains("expAvg")) pp.expAvg = bufferRef(c, p, e["expAvg"], here + ".expAvg");
    if (e.contains("expAvgSq")) pp.expAvgSq = bufferRef(c, p, e["expAvgSq"], here + ".expAvgSq");
    const json& shard = field(c, e, "shard", where);
    if (!shard.is_array()) c.fail(here + ".shard must be a list of [start, length]");
    for (const auto& s : shard) {
      if (!s.is_array() || s.size() != 2) c.fail(here + ".shard must be a list of [start, length]");
      const int64_t start = asInt(c, s[0], here + ".shard"), len = asInt(c, s[1], here + ".shard");
      if (start < 0 || len < 0) c.fail(here + ".shard has a negative start or length");
      pp.shard.emplace_back(start, len);
    }
    const Buffer& b = p.buffers[size_t(pp.buffer)];
    if (b.region != Region::param)
      c.fail(cat(here, ": ", bufferText(p, b.id), " is in region ", regionName(b.region), ", not param"));
    if (!pp.shard.empty() && pp.shard.size() != b.shape.size())
      c.fail(cat(here, ": shard has ", pp.shard.size(), " dims, its buffer ", b.shape.size()));
    for (size_t d = 0; d < pp.shard.size(); d++)
      if (b.shape[d].symbolic() || b.shape[d].value != pp.shard[d].second)
        c.fail(cat(here, ": shard length ", pp.shard[d].second, " of dim ", d, " differs from its buffer ",
                   formatShape(b.shape)));
    p.params.push_back(std::move(pp));
  }
}

void parseInputs(const Ctx& c, const json& j, Program& p) {
  const json& list = field(c, j, "inputs", "the program");
  if (!list.is_array()) c.fail("'inputs' must be a list");
  for (size_t i = 0; i < list.size(); i++) {
    const json& e = list[i];
    const std::string where = cat("inputs[", i, "]");
    ProgramInput in;
    in.name = asString(c, field(c, e, "name", where), where + ".name");
    int f = -1;
    for (int k = 0; k < int(DataField::kCount); k++)
      if (in.name == kDataFieldNames[k]) f = k;
    if (f < 0) c.fail(cat("input '", in.name, "' is not a data field this runtime fills"));
    in.field = DataField(f);
    in.buffer = bufferRef(c, p, field(c, e, "buffer", where), "input " + in.name);
    in.microbatch = int(asInt(c, field(c, e, "microbatch", where), where + ".microbatch"));
    const Buffer& b = p.buffers[size_t(in.buffer)];
    const std::string here = cat("input ", in.name, " of microbatch ", in.microbatch);
    if (in.microbatch < 0) c.fail(here + ": microbatch must be ≥ 0");
    if (b.region != Region::data)
      c.fail(cat(here, ": ", bufferText(p, b.id), " is in region ", regionName(b.region), ", not data"));
    if (b.microbatch != in.microbatch)
      c.fail(cat(here, ": ", bufferText(p, b.id), " belongs to microbatch ", b.microbatch));
    // a float field (patches) may also be stored in bf16: the values are rounded when written
    const bool floatField = kDataFieldTypes[f] == DType::f32;
    if (b.dtype != kDataFieldTypes[f] && !(floatField && b.dtype == DType::bf16))
      c.fail(cat(here, ": ", bufferText(p, b.id), " has dtype ", dtypeName(b.dtype), ", expected ",
                 dtypeName(kDataFieldTypes[f]), floatField ? " or bf16" : ""));
    for (const auto& other : p.inputs)
      if (other.name == in.name && other.microbatch == in.microbatch) c.fail(here + " is listed twice");
    p.inputs.push_back(std::move(in));
  }
}

void parseScalarsAndOutputs(const Ctx& c, const json& j, Program& p) {
  const json& scalars = field(c, j, "scalars", "the program");
  if (!scalars.is_object()) c.fail("'scalars' must be an object of name → buffer id");
  for (const auto& [name, v] : scalars.items()) {
    const int id = bufferRef(c, p, v, "scalar " + name);
    const Buffer& b = p.buffers[size_t(id)];
    if (b.symbolic || numel(resolveShape(b.shape, {})) != 1)
      c.fail(cat("scalar ", name, ": ", bufferText(p, id), " has shape ", formatShape(b.shape),
                 ", not one element"));
    p.scalars.emplace_back(name, id);
  }
  const json& outputs = field(c, j, "outputs", "the program");
  if (!outputs.is_array()) c.fail("'outputs' must be a list");
  for (size_t i = 0; i < outputs.size(); i++) {
    const std::string where = cat("outputs[", i, "]");
    ProgramOutput o;
    o.name = asString(c, field(c, outputs[i], "name", where), where + ".name");
    o.buffer = bufferRef(c, p, field(c, outputs[i], "buffer", where), "output " + o.name);
    o.microbatch = int(asInt(c, field(c, outputs[i], "microbatch", where), where + ".microbatch"));
    const Buffer& b = p.buffers[size_t(o.buffer)];
    if (b.symbolic || numel(resolveShape(b.shape, {})) != 1)
      c.fail(cat("output ", o.name, ": ", bufferText(p, o.buffer), " has shape ", formatShape(b.shape),
                 ", not one element"));
    p.outputs.push_back(std::move(o));
  }
}

void parseInstrs(const Ctx& c, const json& j, Program& p) {
  const json& list = field(c, j, "instructions", "the program");
  if (!list.is_array()) c.fail("'instructions' must be a list");
  for (size_t i = 0; i < list.size(); i++) {
    const json& e = list[i];
    Instr in;
    in.index = int(i);
    // scope and op first, so that every later message can name them
    std::string opText = "?";
    if (e.is_object() && e.contains("op") && e["op"].is_string()) opText = e["op"].get<std::string>();
    if (e.is_object() && e.contains("scope") && e["scope"].is_string()) in.scope = e["scope"].get<std::string>();
    const std::string here = cat("instruction ", i, " (", opText, ", scope ", in.scope.empty() ? "?" : in.scope, ")");
    const auto bad = [&](const std::string& msg) { c.fail(here + ": " + msg); };
    if (!e.is_object()) bad("must be an object");
    for (const char* key : {"stream", "op", "inputs", "outputs", "attrs", "wait", "record", "microbatch", "phase", "scope"})
      if (!e.contains(key)) bad(cat("has no '", key, "'"));
    if (!e["op"].is_string()) bad("op must be a string");
    int op = -1;
    for (int k = 0; k < kOpCount; k++)
      if (opText == schema::kOpNames[k]) op = k;
    if (op < 0) bad(cat("unknown op '", opText, "'"));
    in.op = Op(op);
    const std::string stream = e["stream"].is_string() ? e["stream"].get<std::string>() : e["stream"].dump();
    in.stream = -1;
    for (int s = 0; s < kStreamCount; s++)
      if (stream == schema::kStreams[s]) in.stream = s;
    if (in.stream < 0) bad(cat("unknown stream '", stream, "'"));
    if (!e["scope"].is_string()) bad("scope must be a string");
    in.phase = e["phase"].is_string() ? e["phase"].get<std::string>() : "";
    if (in.phase != "forward" && in.phase != "backward" && in.phase != "optimizer")
      bad(cat("unknown phase ", e["phase"].dump()));
    const bool collective = opEntry(in.op).cls == OpClass::collective;
    if (collective && !c.options.collectives)
      bad(cat("op ", opText, " needs a collective backend; this runtime runs one rank"));
    if (!collective && opEntry(in.op).run == nullptr)
      bad(cat("op ", opText, " has no implementation in the registry"));
    const int nb = int(p.buffers.size());
    const auto buffers = [&](const char* key, std::vector<int>& out) {
      if (!e[key].is_array()) bad(cat(key, " must be a list of buffer ids"));
      for (const auto& v : e[key]) {
        int64_t id = -1;
        if (v.is_number_integer()) id = v.get<int64_t>();
        else bad(cat(key, " holds ", v.dump(), ", not a buffer id"));
        if (id < 0 || id >= nb) bad(cat(key, ": buffer id ", id, " is out of range (", nb, " buffers)"));
        out.push_back(int(id));
      }
    };
    buffers("inputs", in.inputs);
    buffers("outputs", in.outputs);
    const auto events = [&](const char* key, std::vector<int>& out) {
      if (!e[key].is_array()) bad(cat(key, " must be a list of event ids"));
      for (const auto& v : e[key]) {
        int64_t id = -1;
        if (v.is_number_integer()) id = v.get<int64_t>();
        else bad(cat(key, " holds ", v.dump(), ", not an event id"));
        if (id < 0 || id >= p.events) bad(cat(key, ": event ", id, " is out of range (", p.events, " events)"));
        out.push_back(int(id));
      }
    };
    events("wait", in.wait);
    events("record", in.record);
    if (!e["attrs"].is_object()) bad("attrs must be an object");
    in.attrs = e["attrs"];
    if (!e["microbatch"].is_number_integer() || e["microbatch"].get<int64_t>() < -1)
      bad(cat("microbatch must be an integer ≥ −1, got ", e["microbatch"].dump()));
    in.microbatch = int(e["microbatch"].get<int64_t>());
    const std::string problem =
        collective ? comm::checkCollective(in, p.symbols) : checkInstrAgainstRegistry(in, p.symbols);
    const bool inPlace = collective ? comm::collectiveInPlace(in.op) : opEntry(in.op).inPlace;
    if (!problem.empty()) bad(problem);
    // operands: symbolic dims need a microbatch; outputs must not overlap inputs (except in place)
    for (int id : in.inputs)
      if (p.buffers[size_t(id)].symbolic && in.microbatch < 0 && p.buffers[size_t(id)].microbatch < 0)
        bad(cat(bufferText(p, id), " is symbolic but the instruction has no microbatch"));
    for (size_t o = 0; o < in.outputs.size(); o++) {
      const Buffer& ob = p.buffers[size_t(in.outputs[o])];
      // views write nothing; the optimizer step writes parameters (the distributed optimizer
      // gathers them)
      const bool writes = ob.viewOf < 0;
      const bool step = in.phase == "optimizer" && ob.region == Region::param;
      if ((ob.region == Region::param || ob.region == Region::data) && writes && !step)
        bad(cat("output ", bufferText(p, ob.id), " is in region ", regionName(ob.region),
                ", which instructions only read"));
      for (size_t k = 0; k < in.inputs.size(); k++) {
        const Buffer& ib = p.buffers[size_t(in.inputs[k])];
        if (ib.region != ob.region) continue;
        if (ob.region == Region::data && ib.microbatch != ob.microbatch) continue;
        const bool overlap = ib.offset < ob.offset + ob.bytes && ob.offset < ib.offset + ib.bytes &&
                             ib.bytes > 0 && ob.bytes > 0;
        if (!overlap) continue;
        const bool sameBytes = ib.offset == ob.offset && ib.bytes == ob.bytes;
        if (o == 0 && k == 0 && sameBytes && inPlace) continue;
        bad(cat("output ", bufferText(p, ob.id), " overlaps input ", bufferText(p, ib.id)));
      }
    }
    p.instrs.push_back(std::move(in));
  }
}

// Each event recorded by exactly one instruction, and every instruction able to run: the
// instructions with "previous on my stream" and "records an event I wait for" edges form no cycle.
void checkEvents(const Ctx& c, Program& p) {
  p.recordedBy.assign(size_t(p.events), -1);
  for (const Instr& in : p.instrs)
    for (int e : in.record) {
      if (p.recordedBy[size_t(e)] >= 0)
        c.fail(cat(describeInstr(in), ": event ", e, " is already recorded by ",
                   describeInstr(p.instrs[size_t(p.recordedBy[size_t(e)])])));
      p.recordedBy[size_t(e)] = in.index;
    }
  for (const Instr& in : p.instrs)
    for (int e : in.wait)
      if (p.recordedBy[size_t(e)] < 0)
        c.fail(cat(describeInstr(in), ": waits for event ", e, ", which no instruction records"));
  for (int e = 0; e < p.events; e++)
    if (p.recordedBy[size_t(e)] < 0) c.fail(cat("event ", e, " is never recorded"));

  {
    std::map<std::string, int> ordinals;
    for (Instr& in : p.instrs) {
      if (!schema::kOpIsCollective[int(in.op)]) continue;
      const auto g = in.attrs.find("group");
      const std::string group = g != in.attrs.end() && g->is_string() ? g->get<std::string>() : "";
      in.commOrdinal = ordinals[cat(group, "#", in.stream)]++;
    }
  }
  p.streamInstrs.assign(kStreamCount, {});
  for (const Instr& in : p.instrs) p.streamInstrs[size_t(in.stream)].push_back(in.index);
  const size_t n = p.instrs.size();
  std::vector<std::vector<int>> next(n);
  std::vector<int> pending(n, 0);
  for (const auto& list : p.streamInstrs)
    for (size_t k = 1; k < list.size(); k++) {
      next[size_t(list[k - 1])].push_back(list[k]);
      pending[size_t(list[k])]++;
    }
  for (const Instr& in : p.instrs)
    for (int e : in.wait) {
      next[size_t(p.recordedBy[size_t(e)])].push_back(in.index);
      pending[size_t(in.index)]++;
    }
  std::queue<int> ready;
  for (size_t i = 0; i < n; i++)
    if (pending[i] == 0) ready.push(int(i));
  size_t done = 0;
  while (!ready.empty()) {
    const int i = ready.front();
    ready.pop();
    done++;
    for (int k : next[size_t(i)])
      if (--pending[size_t(k)] == 0) ready.push(k);
  }
  if (done != n) {
    // the first instruction (in issue order) that can never start
    for (size_t i = 0; i < n; i++)
      if (pending[i] > 0) {
        const Instr& in = p.instrs[i];
        std::string waits;
        for (int e : in.wait) waits += cat(waits.empty() ? "" : ", ", e, " (recorded by instruction ", p.recordedBy[size_t(e)], ")");
        c.fail(cat(describeInstr(in), " can never start: its stream and the events it waits for",
                   waits.empty() ? "" : " [" + waits + "]", " form a cycle (deadlock)"));
      }
  }
}

// A batched send/recv (a `batch` attribute; consecutive instructions of one stream) posts every
// member, then waits for all at the batch's last instruction: its sends read and its recvs write
// for the whole batch, so no recv may write bytes another member reads or writes.
void checkBatches(const Ctx& c, const Program& p) {
  const auto batchOf = [&](int idx) -> int64_t {
    const Instr& x = p.instrs[size_t(idx)];
    return x.attrs.contains("batch") && x.attrs.at("batch").is_number_integer() ? x.attrs.at("batch").get<int64_t>() : -1;
  };
  const auto overlap = [&](int a, int b) {
    const Buffer &x = p.buffers[size_t(a)], &y = p.buffers[size_t(b)];
    if (x.region != y.region || (x.region == Region::data && x.microbatch != y.microbatch)) return false;
    return x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes && x.bytes > 0 && y.bytes > 0;
  };
  for (const std::vector<int>& order : p.streamInstrs)
    for (size_t k = 0; k < order.size();) {
      const int64_t batch = batchOf(order[k]);
      size_t end = k + 1;
      while (batch >= 0 && end < order.size() && batchOf(order[end]) == batch) end++;
      // (instruction, buffer, written) of every member
      std::vector<std::tuple<int, int, bool>> operands;
      for (size_t i = k; i < end; i++) {
        const Instr& in = p.instrs[size_t(order[i])];
        for (int id : in.inputs) operands.emplace_back(in.index, id, false);
        for (int id : in.outputs) operands.emplace_back(in.index, id, true);
      }
      for (size_t i = 0; i < operands.size(); i++)
        for (size_t j = 0; j < operands.size(); j++) {
          const auto& [wi, wb, written] = operands[i];
          const auto& [oi, ob, otherWritten] = operands[j];
          if (!written || wi == oi || (otherWritten && j < i) || !overlap(wb, ob)) continue;
          c.fail(cat(describeInstr(p.instrs[size_t(wi)]), " and ", describeInstr(p.instrs[size_t(oi)]),
                     " are in flight together (batch ", batch, "), but the first writes ", bufferText(p, wb),
                     " over bytes of ", bufferText(p, ob), ", which the second ", otherWritten ? "writes" : "reads",
                     " (the memory plan must keep a batch's buffers apart until its last instruction)"));
        }
      k = end;
    }
}

}  // namespace

int Program::scalarBuffer(const std::string& name) const {
  for (const auto& [n, id] : scalars)
    if (n == name) return id;
  return -1;
}

std::string describeInstr(const Instr& in) {
  return cat("instruction ", in.index, " (", schema::kOpNames[int(in.op)], ", scope ",
             in.scope.empty() ? "?" : in.scope, ")");
}

Program parseProgram(const std::string& text, const ParseOptions& options) {
  Ctx c;
  c.options = options;
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw ProgramError(std::string("program JSON does not parse: ") + e.what());
  }
  if (!j.is_object()) throw ProgramError("program JSON must be an object");
  Program p;
  if (j.contains("id") && j["id"].is_string()) p.id = j["id"].get<std::string>();
  c.program = p.id.empty() ? "?" : p.id;
  const json& format = field(c, j, "format", "the program");
  if (!format.is_string() || format.get<std::string>() != kProgramFormat)
    c.fail(cat("format is ", format.dump(), ", expected \"", kProgramFormat, "\""));
  const int64_t version = asInt(c, field(c, j, "version", "the program"), "version");
  if (version != schema::kPlanVersion)
    c.fail(cat("plan version ", version, " is not supported: this runtime reads plan version ",
               schema::kPlanVersion));
  const json& regions = field(c, j, "regions", "the program");
  for (const char* r : schema::kRegions) {
    int ri = -1;
    for (int k = 0; k < kRegionCount; k++)
      if (std::string(r) == kRegionNames[k]) ri = k;
    if (ri < 0) c.fail(cat("region '", r, "' of the schema is not supported by this runtime"));
    const int64_t bytes = asInt(c, field(c, regions, r, "regions"), cat("regions.", r));
    if (bytes < 0) c.fail(cat("regions.", r, " is negative"));
    p.regionBytes[size_t(ri)] = bytes;
  }
  const json& scratch = field(c, j, "scratchBytes", "the program");
  int64_t scratchTotal = 0;
  for (int s = 0; s < kStreamCount; s++) {
    const char* name = schema::kStreams[s];
    const int64_t bytes = asInt(c, field(c, scratch, name, "scratchBytes"), cat("scratchBytes.", name));
    if (bytes < 0 || bytes % 64 != 0) c.fail(cat("scratchBytes.", name, " = ", bytes, " is not a multiple of 64 ≥ 0"));
    p.scratchBytes[size_t(s)] = bytes;
    scratchTotal += bytes;
  }
  if (scratchTotal != p.regionSize(Region::scratch))
    c.fail(cat("scratchBytes sum to ", scratchTotal, ", regions.scratch is ", p.regionSize(Region::scratch)));
  if (j.contains("arenaLowerBoundBytes"))
    p.arenaLowerBoundBytes = asInt(c, j["arenaLowerBoundBytes"], "arenaLowerBoundBytes");
  p.events = int(asInt(c, field(c, j, "events", "the program"), "events"));
  if (p.events < 0) c.fail("events must be ≥ 0");

  parseSymbols(c, j, p);
  parseBuffers(c, j, p);
  parseParams(c, j, p);
  parseInputs(c, j, p);
  parseScalarsAndOutputs(c, j, p);
  parseInstrs(c, j, p);
  checkEvents(c, p);
  checkBatches(c, p);

  int maxMb = -1;
  for (const Buffer& b : p.buffers) maxMb = std::max(maxMb, b.microbatch);
  for (const ProgramInput& in : p.inputs) maxMb = std::max(maxMb, in.microbatch);
  for (const ProgramOutput& o : p.outputs) maxMb = std::max(maxMb, o.microbatch);
  for (const Instr& in : p.instrs) maxMb = std::max(maxMb, in.microbatch);
  p.slots = maxMb + 1;
  return p;
}

}  // namespace lfc
