#include "comm/collectives.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "comm/sum.h"
#include "comm/test_fault.h"
#include "core/error.h"

namespace lfc::comm {

namespace {

struct Group {
  Communicator& comm;
  int P, r;
  int globalRank;  // this rank in the world (LFC_TEST_FAULT names it)
};

// LFC_TEST_FAULT's kill_between_phases: this process ends as kill -9 would end it
void killBetweenPhases(const Group& g) {
  if (testFault("kill_between_phases", g.globalRank)) kill(getpid(), SIGKILL);
}

using RunFn = int64_t (*)(const Instr&, StepCtx&, Group&);

// One line per collective: operand counts (inputs min..max, outputs min..max), the attributes the
// loader checks (`name:type`, `name?:type` when optional), in place or not, the function.
struct CollectiveEntry {
  int minIn, maxIn, minOut, maxOut;
  const char* attrs;
  bool inPlace;
  RunFn run;
};

// ---- the ops --------------------------------------------------------------------------------

void requireFloatOrInt(const Tensor& t, const char* what) {
  if (t.dtype != DType::f32 && t.dtype != DType::f64 && t.dtype != DType::bf16 && t.dtype != DType::i32 &&
      t.dtype != DType::i64)
    throw OpError(cat(what, " has dtype ", dtypeName(t.dtype), "; collectives sum f32, f64, bf16, i32 or i64"));
}

void requireSameType(const Tensor& y, const Tensor& x, int64_t numel, const char* what) {
  requireDType(y, x.dtype, what);
  requireNumel(y, numel, what);
}

void copyIfApart(const Tensor& to, const Tensor& from) {
  if (to.data != from.data && from.bytes() > 0) std::memmove(to.data, from.data, size_t(from.bytes()));
}

int rootOf(const StepCtx& c, const Group& g) {
  const int64_t root = c.integer("root");
  if (root < 0 || root >= g.P) throw OpError(cat("root ", root, " is not a group rank (group of ", g.P, ")"));
  return int(root);
}

int64_t rowBytes(const Tensor& t) { return t.last() * dtypeBytes(t.dtype); }

void requireRows(const Tensor& x, const Tensor& y) {
  requireRank(x, 2, "input 0 (rows)");
  requireRank(y, 2, "output 0 (rows)");
  requireDType(y, x.dtype, "output 0 (rows)");
  if (y.last() != x.last())
    throw OpError(cat("output 0 ", formatShape(y.shape), " has rows of ", y.last(), " values, input 0 ",
                      formatShape(x.shape), " of ", x.last()));
}

int64_t run_all_reduce(const Instr& in, StepCtx& c, Group& g) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireFloatOrInt(x, "input 0");
  requireSameType(y, x, x.numel, "output 0");
  copyIfApart(y, x);
  g.comm.allReduce(y.data, y.dtype, y.numel, in.commOrdinal);
  return -1;
}

int64_t run_all_gather(const Instr&, StepCtx& c, Group& g) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireSameType(y, x, x.numel * g.P, "output 0 (every rank's input, concatenated)");
  g.comm.allGather(x.data, y.data, x.bytes());
  return -1;
}

int64_t run_reduce_scatter(const Instr&, StepCtx& c, Group& g) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireFloatOrInt(x, "input 0");
  if (x.numel % g.P != 0) throw OpError(cat("input 0 ", formatShape(x.shape), " does not split in ", g.P, " blocks"));
  const int64_t blockCount = x.numel / g.P;
  if (y.data == x.data && y.numel == x.numel) {
    // in place (the distributed optimizer's gradient buckets): block r of x becomes block r of
    // the sum; the other blocks are left undefined
    g.comm.reduceScatter(x.data, x.data + g.r * blockCount * dtypeBytes(x.dtype), x.dtype, blockCount);
    return -1;
  }
  requireSameType(y, x, blockCount, "output 0 (one block of the sum)");
  g.comm.reduceScatter(x.data, y.data, x.dtype, blockCount);
  return -1;
}

int64_t run_broadcast(const Instr&, StepCtx& c, Group& g) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireSameType(y, x, x.numel, "output 0");
  const int root = rootOf(c, g);
  if (g.r == root) copyIfApart(y, x);
  g.comm.broadcast(y.data, y.bytes(), root);
  return -1;
}

std::vector<int64_t> counts(const Tensor& t, int P, const char* what) {
  requireDType(t, DType::i32, what);
  requireNumel(t, P, what);
  std::vector<int64_t> v(static_cast<size_t>(P));
  for (int i = 0; i < P; i++) {
    v[size_t(i)] = t.as<int32_t>()[i];
    if (v[size_t(i)] < 0) throw OpError(cat(what, "[", i, "] = ", v[size_t(i)], " is negative"));
  }
  return v;
}

std::vector<int64_t> times(std::vector<int64_t> v, int64_t k) {
  for (auto& x : v) x *= k;
  return v;
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

// The row counts of every group rank: each gives its own.
std::vector<int64_t> gatherRows(Group& g, int64_t mine) {
  std::vector<int64_t> all(size_t(g.P));  // (P): per group rank, like the counts lists
  g.comm.allGather(&mine, all.data(), sizeof(int64_t));
  return all;
}

int64_t run_all_to_all_v(const Instr& in, StepCtx& c, Group& g) {
  const Tensor &x = c.in(0), &y = c.out(0), &recvCounts = c.out(1);
  requireRows(x, y);
  const std::vector<int64_t> send = counts(c.in(1), g.P, "input 1 (send_counts)");
  if (sum(send) > x.dim(0))
    throw OpError(cat("send_counts sum to ", sum(send), " rows, input 0 ", formatShape(x.shape), " has ", x.dim(0)));
  requireDType(recvCounts, DType::i32, "output 1 (recv_counts)");
  requireNumel(recvCounts, g.P, "output 1 (recv_counts)");
  // 1. the counts: rank j learns how many rows each rank sends it
  std::vector<int32_t> sent(send.begin(), send.end());
  int32_t* got = recvCounts.as<int32_t>();
  g.comm.allToAllV(sent.data(), std::vector<int64_t>(size_t(g.P), 4), got, std::vector<int64_t>(size_t(g.P), 4));
  std::vector<int64_t> recv(got, got + g.P);
  killBetweenPhases(g);
  const int64_t rows = sum(recv);
  const bool forced = testFault("all_to_all_v_bound", g.globalRank);
  if (rows > y.dim(0) || forced)
    throw OpError(cat("receive bound exceeded: receives ", rows, " rows; output 0 ", formatShape(y.shape),
                      " holds at most ", y.dim(0), " (the bound of its out_rows ",
                      in.attrs.at("out_rows").at(0).get<std::string>(), " at this microbatch's sizes)",
                      forced ? " [forced by LFC_TEST_FAULT]" : ""));
  // 2. the rows
  g.comm.allToAllV(x.data, times(send, rowBytes(x)), y.data, times(recv, rowBytes(y)));
  return rows;
}

// gather_v: one output (the blocks concatenated in group order) or one output per group rank
// (block i in output i); scatter_v the same way round for its inputs. Row counts first.
int64_t run_gather_v(const Instr&, StepCtx& c, Group& g) {
  const Tensor& x = c.in(0);
  requireRank(x, 2, "input 0 (rows)");
  const int root = rootOf(c, g);
  const bool perRank = c.numOut() > 1;
  if (perRank && c.numOut() != g.P)
    throw OpError(cat(c.numOut(), " outputs: one, or one per group rank (", g.P, ")"));
  const std::vector<int64_t> rows = gatherRows(g, x.dim(0));
  killBetweenPhases(g);
  const std::vector<int64_t> recv = times(rows, rowBytes(x));  // every rank's block, in bytes
  std::byte* into = c.out(0).data;
  if (g.r == root) {
    for (int i = 0; i < c.numOut(); i++) requireRows(x, c.out(i));
    const char* forced = testFault("gather_v_rows", g.globalRank) ? " [forced by LFC_TEST_FAULT]" : "";
    if (!perRank && (sum(rows) > c.out(0).dim(0) || *forced))
      throw OpError(cat("row count wrong: the group's blocks sum to ", sum(rows), " rows; output 0 ",
                        formatShape(c.out(0).shape), " holds at most ", c.out(0).dim(0),
                        " (its out_rows bound at this microbatch's sizes)", forced));
    if (perRank)
      for (int i = 0; i < g.P; i++)
        if (rows[size_t(i)] != c.out(i).dim(0) || *forced)
          throw OpError(cat("row count wrong: group rank ", i, " sends ", rows[size_t(i)], " rows; output ", i, " ",
                            formatShape(c.out(i).shape), " has ", c.out(i).dim(0), forced));
    into = perRank ? c.scratch<std::byte>(sum(recv)) : c.out(0).data;
  }
  g.comm.gatherV(x.data, into, recv, root);
  if (g.r != root) return perRank ? -1 : 0;
  if (!perRank) return sum(rows);
  int64_t at = 0;
  for (int i = 0; i < g.P; i++) {
    if (recv[size_t(i)] > 0) std::memcpy(c.out(i).data, into + at, size_t(recv[size_t(i)]));
    at += recv[size_t(i)];
  }
  return -1;
}

int64_t run_scatter_v(const Instr&, StepCtx& c, Group& g) {
  const Tensor& y = c.out(0);
  requireRank(y, 2, "output 0 (rows)");
  const int root = rootOf(c, g);
  const bool perRank = c.numIn() > 1;
  if (perRank && c.numIn() != g.P)
    throw OpError(cat(c.numIn(), " inputs: one, or one per group rank (", g.P, ")"));
  const std::vector<int64_t> rows = gatherRows(g, y.dim(0));
  killBetweenPhases(g);
  std::vector<int64_t> send(size_t(g.P), 0), recv(size_t(g.P), 0);
  recv[size_t(root)] = y.dim(0) * rowBytes(y);
  const std::byte* from = c.in(0).data;
  if (g.r == root) {
    for (int i = 0; i < c.numIn(); i++) requireRows(c.in(i), y);
    send = times(rows, rowBytes(y));
    if (!perRank) {
      if (sum(rows) > c.in(0).dim(0))
        throw OpError(cat("row count wrong: the group's outputs take ", sum(rows), " rows; input 0 ",
                          formatShape(c.in(0).shape), " has ", c.in(0).dim(0)));
      from = c.in(0).data;
    } else {
      // the blocks side by side in scratch, in group order
      std::byte* packed = c.scratch<std::byte>(sum(send));
      int64_t at = 0;
      for (int i = 0; i < g.P; i++) {
        if (rows[size_t(i)] != c.in(i).dim(0))
          throw OpError(cat("row count wrong: group rank ", i, " takes ", rows[size_t(i)], " rows; input ", i, " ",
                            formatShape(c.in(i).shape), " has ", c.in(i).dim(0)));
        if (send[size_t(i)] > 0) std::memcpy(packed + at, c.in(i).data, size_t(send[size_t(i)]));
        at += send[size_t(i)];
      }
      from = packed;
    }
  }
  g.comm.allToAllV(const_cast<std::byte*>(from), send, y.data, recv);
  return y.dim(0);
}

// all_gather_v / reduce_scatter_v: every rank passes the same counts, one per group rank
std::vector<int64_t> blockRows(StepCtx& c, const Group& g) { return counts(c.in(1), g.P, "input 1 (counts)"); }

int64_t run_all_gather_v(const Instr& in, StepCtx& c, Group& g) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireRows(x, y);
  const std::vector<int64_t> rows = blockRows(c, g);
  if (rows[size_t(g.r)] > x.dim(0))
    throw OpError(cat("counts[", g.r, "] = ", rows[size_t(g.r)], " rows, input 0 ", formatShape(x.shape), " has ",
                      x.dim(0)));
  if (sum(rows) > y.dim(0))
    throw OpError(cat("receive bound exceeded: gathers ", sum(rows), " rows; output 0 ", formatShape(y.shape),
                      " holds at most ", y.dim(0), " (the bound of its out_rows ",
                      in.attrs.at("out_rows").at(0).get<std::string>(), " at this microbatch's sizes)"));
  // one broadcast per group rank, each straight into its block of y
  const int64_t rb = rowBytes(x);
  int64_t at = 0;
  for (int i = 0; i < g.P; i++) {
    const int64_t bytes = rows[size_t(i)] * rb;
    if (i == g.r && bytes > 0) std::memmove(y.data + at, x.data, size_t(bytes));
    if (bytes > 0) g.comm.broadcast(y.data + at, bytes, i);
    at += bytes;
  }
  return sum(rows);
}

template <typename T>
void sumBlocks(std::byte* out, const std::byte* parts, int P, int64_t n) {
  std::vector<const T*> p(static_cast<size_t>(P));
  for (int j = 0; j < P; j++) p[size_t(j)] = reinterpret_cast<const T*>(parts) + j * n;
  sumParts(reinterpret_cast<T*>(out), p.data(), P, n);
}

int64_t run_reduce_scatter_v(const Instr&, StepCtx& c, Group& g) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireRows(x, y);
  const std::vector<int64_t> rows = blockRows(c, g);
  if (sum(rows) > x.dim(0))
    throw OpError(cat("counts sum to ", sum(rows), " rows, input 0 ", formatShape(x.shape), " has ", x.dim(0)));
  const int64_t mine = rows[size_t(g.r)];
  if (mine > y.dim(0))
    throw OpError(cat("counts[", g.r, "] = ", mine, " rows; output 0 ", formatShape(y.shape), " holds at most ",
                      y.dim(0)));
  // block j of x to rank j; this rank's block from every rank into scratch, summed in group order
  const int64_t rb = rowBytes(x);
  std::byte* parts = c.scratch<std::byte>(g.P * mine * rb);
  g.comm.allToAllV(x.data, times(rows, rb), parts, std::vector<int64_t>(size_t(g.P), mine * rb));
  const int64_t n = mine * x.last();
  switch (x.dtype) {
    case DType::f32: sumBlocks<float>(y.data, parts, g.P, n); break;
    case DType::f64: sumBlocks<double>(y.data, parts, g.P, n); break;
    case DType::bf16: sumBlocks<bf16>(y.data, parts, g.P, n); break;
    default: throw OpError(cat("input 0 has dtype ", dtypeName(x.dtype), "; reduce_scatter_v sums f32, f64 or bf16"));
  }
  return mine;
}

int peerOf(const StepCtx& c, const Group& g) {
  const int64_t peer = c.integer("peer");
  if (peer < 0 || peer >= g.P || peer == g.r)
    throw OpError(cat("peer ", peer, " is not another rank of the group (group rank ", g.r, " of ", g.P, ")"));
  return int(peer);
}

uint32_t tagOf(const StepCtx& c) {
  const int64_t tag = c.integer("tag");
  if (tag < 0 || tag > int64_t(UINT32_MAX)) throw OpError(cat("tag ", tag, " is out of range"));
  return uint32_t(tag);
}

// with a `batch` attribute, send and recv are posted and complete together at the batch's last
// instruction (runCollective's batchEnd)
int64_t run_send(const Instr&, StepCtx& c, Group& g) {
  const Tensor& x = c.in(0);
  if (c.has("batch"))
    g.comm.postSend(x.data, x.bytes(), peerOf(c, g), tagOf(c));
  else
    g.comm.send(x.data, x.bytes(), peerOf(c, g), tagOf(c));
  return -1;
}

int64_t run_recv(const Instr&, StepCtx& c, Group& g) {
  const Tensor& y = c.out(0);
  if (c.has("batch"))
    g.comm.postRecv(y.data, y.bytes(), peerOf(c, g), tagOf(c));
  else
    g.comm.recv(y.data, y.bytes(), peerOf(c, g), tagOf(c));
  return -1;
}

// ---- the table ------------------------------------------------------------------------------

constexpr const char* kGroup = "group:string,group_size:int";

const CollectiveEntry* entryOf(Op op) {
  static const CollectiveEntry allReduce{1, 1, 1, 1, kGroup, true, run_all_reduce};
  static const CollectiveEntry allGather{1, 1, 1, 1, "group:string,group_size:int,grad?:string", false,
                                         run_all_gather};
  static const CollectiveEntry reduceScatter{1, 1, 1, 1, kGroup, true, run_reduce_scatter};
  static const CollectiveEntry broadcast{1, 1, 1, 1, "group:string,group_size:int,root:int", true, run_broadcast};
  // dispatcher and top_k: how a GPU machine prices an expert dispatch (ir/ops.ts); the rows move alike
  static const CollectiveEntry allToAllV{
      2, 2, 2, 2, "group:string,group_size:int,out_rows:dims,dispatcher?:string,top_k?:int", false, run_all_to_all_v};
  static const CollectiveEntry gatherV{1, 1, 1, 1 << 16, "group:string,group_size:int,root:int,out_rows:dims", false,
                                       run_gather_v};
  static const CollectiveEntry scatterV{1, 1 << 16, 1, 1, "group:string,group_size:int,root:int,out_rows:dims", false,
                                        run_scatter_v};
  static const CollectiveEntry allGatherV{2, 2, 1, 1, "group:string,group_size:int,out_rows:dims", false,
                                          run_all_gather_v};
  static const CollectiveEntry reduceScatterV{2, 2, 1, 1, "group:string,group_size:int,out_rows:dims", false,
                                              run_reduce_scatter_v};
  static const CollectiveEntry send{1, 1, 0, 0, "group:string,group_size?:int,peer:int,tag:int,batch?:int", false, run_send};
  static const CollectiveEntry recv{0, 0, 1, 1, "group:string,group_size?:int,peer:int,tag:int,dtype:dtype,shape:dims,batch?:int",
                                    false, run_recv};
  switch (op) {
    case Op::all_reduce: return &allReduce;
    case Op::all_gather: return &allGather;
    case Op::reduce_scatter: return &reduceScatter;
    case Op::broadcast: return &broadcast;
    case Op::all_to_all_v: return &allToAllV;
    case Op::gather_v: return &gatherV;
    case Op::scatter_v: return &scatterV;
    case Op::all_gather_v: return &allGatherV;
    case Op::reduce_scatter_v: return &reduceScatterV;
    case Op::send: return &send;
    case Op::recv: return &recv;
    default: return nullptr;
  }
}

bool integral(const nlohmann::json& v) {
  if (v.is_number_integer()) return true;
  return v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>());
}

// "" when v fits the type (the subset of ir/ops.ts's attribute types collectives use)
std::string typeProblem(const std::string& type, const nlohmann::json& v, const SymbolTable& symbols) {
  bool ok = false;
  if (type == "int") ok = integral(v);
  else if (type == "string") ok = v.is_string();
  else if (type == "dtype") ok = v.is_string() && parseDType(v.get<std::string>()).has_value();
  else if (type == "dims") {
    ok = v.is_array();
    for (const auto& d : v.is_array() ? v : nlohmann::json::array()) {
      if (!d.is_string()) return "must be a list of dims as strings, got " + v.dump();
      try {
        parseDim(d.get<std::string>(), symbols);
      } catch (const std::exception& e) {
        return e.what();
      }
    }
  }
  return ok ? "" : "must be " + type + ", got " + v.dump();
}

}  // namespace

bool collectiveInPlace(Op op) {
  const CollectiveEntry* e = entryOf(op);
  return e && e->inPlace;
}

std::string checkCollective(const Instr& in, const SymbolTable& symbols) {
  const CollectiveEntry* e = entryOf(in.op);
  const char* name = schema::kOpNames[int(in.op)];
  if (!e) return cat(name, " is not a collective");
  const int ni = int(in.inputs.size()), no = int(in.outputs.size());
  if (ni < e->minIn || ni > e->maxIn) return cat(name, " takes ", e->minIn, " inputs, got ", ni);
  if (no < e->minOut || no > e->maxOut) return cat(name, " gives ", e->minOut, " outputs, got ", no);
  std::vector<std::string> known;
  const std::string spec = e->attrs;
  for (size_t pos = 0; pos < spec.size();) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    std::string key = item.substr(0, item.find(':'));
    const std::string type = item.substr(item.find(':') + 1);
    const bool optional = key.back() == '?';
    if (optional) key.pop_back();
    known.push_back(key);
    if (!in.attrs.contains(key)) {
      if (optional) continue;
      return cat("missing attribute '", key, "' (", type, ")");
    }
    const std::string problem = typeProblem(type, in.attrs.at(key), symbols);
    if (!problem.empty()) return cat("attribute '", key, "' ", problem);
  }
  for (const auto& [key, _] : in.attrs.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      return cat("unknown attribute '", key, "' for ", name);
  return "";
}

int64_t runCollective(const Instr& in, StepCtx& c, Backend& backend, bool batchEnd) {
  const std::string kind = c.str("group");
  Communicator* comm = nullptr;
  try {
    comm = &backend.at(groupOf(backend.config(), kind), in.stream);
  } catch (const CommError& e) {
    throw OpError(e.what());
  }
  Group g{*comm, comm->size(), comm->rank(), backend.config().rank};
  if (in.attrs.contains("group_size") && c.integer("group_size") != g.P)
    throw OpError(cat("group ", comm->name(), " (kind ", kind, ") has ", g.P, " ranks; the instruction says group_size ",
                      c.integer("group_size")));
  try {
    const int64_t rows = entryOf(in.op)->run(in, c, g);
    if (batchEnd) comm->waitPosted();
    return rows;
  } catch (const PeerFailure& e) {
    throw PeerFailedError(cat("over group ", comm->name(), " (kind ", kind, "): ", e.what()), e.reason);
  } catch (const CommError& e) {
    throw OpError(cat("over group ", comm->name(), " (kind ", kind, "): ", e.what()));
  }
}

}  // namespace lfc::comm
