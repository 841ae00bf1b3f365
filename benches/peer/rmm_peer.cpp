// rmm_peer: the RMM C++ side of rmm-rs's peer comparison (`bash gpu-bundle/run.sh peer`).
//
// usage: rmm_peer PLAN OUT.tsv
//        rmm_peer --frag PLAN OUT.tsv
//        rmm_peer --replay LOG.csv
//
// Reads a plan written by rmm-rs (`examples/peer plan`, format in benches/src/peer.rs),
// replays every workload with RMM 26.10's resources exactly as rmm-rs's `examples/peer run`
// does with its own, and writes one result line per cell (workload, resource, thread count)
// to OUT.tsv, in the same format. For each cell: one non-blocking stream per thread and the
// resource (over a statistics adaptor over the CUDA resource, or the driver pool for
// `async`); `warmup` untimed and `reps` timed passes, each on `threads` threads started
// together at a barrier, each thread replaying its own copy of the workload on its own stream
// (allocate/deallocate with alignment 256, then synchronize its stream); a pass costs the
// slowest thread's wall time / (operations x threads); the cell's figure is the median.
// Which cells a resource runs is the plan's rule (benches/src/peer.rs, PeerResource::runs):
// `cuda` on one thread only, `fixed_size MAX` on workloads whose largest allocation is at most
// MAX (block = that largest allocation, 128 blocks a chunk); `naive` is rmm-rs's baseline and
// is skipped here.
//
// With --frag (`run.sh peer-frag`): PLAN is rmm-rs's fragmentation plan (`examples/peer
// frag-plan`, format in benches/src/frag.rs): the maximum M and the multi-stream workload with
// the values rmm-rs's generator draws for it. The program first replays the workload from
// those values with an allocator that never refuses and checks it gives the plan's trace
// operation for operation (else it stops), then measures, as rmm-rs's `fragmentation`
// benchmark does its own: RMM issue 1957 with pool_memory_resource (initial 2 MiB, maximum
// 64 MiB over cuda_memory_resource, one allocation of 64 MiB), and, for pool_memory_resource
// (initial 0, maximum M) and arena_memory_resource (size M), each over a statistics adaptor
// over cuda_memory_resource, and cuda_async_memory_resource (RMM's defaults): issue 496 (8 MiB
// allocations up to 75 % of M, freed, then two of 40 % of M) and the multi-stream workload on
// 4 non-blocking streams (out-of-memory allocations counted and skipped; bytes reserved read
// after every step), then the largest allocation served on the first stream (binary search,
// 2 MiB resolution). rmm::out_of_memory is "out of memory"; any other exception makes the row
// an error. One line per row to OUT.tsv, the format of rmm-rs's `frag-run`.
//
// With --replay (`run.sh peer-replay`): LOG is a memory-event log in RMM's CSV format, replayed
// once on one thread through pool_memory_resource as `rmm-replay --resource pool` replays it
// (see run_replay below); one `replay` line with the steps, the wall time and the peaks.
//
// Built on the GPU machine by run.sh with nvcc against the librmm-cu13 and rapids-logger
// wheels (C++20, the wheel's CCCL headers ahead of the toolkit's). Host code only.

#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/fixed_size_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/resource_ref.hpp>
#include <rmm/version_config.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

struct Op {
  bool alloc;
  std::uint32_t slot;
  std::size_t size;  // 0 for a free
};

struct Workload {
  std::string name;
  std::size_t slots{};
  std::vector<Op> ops;
  std::size_t largest{};  // the largest allocation
};

struct Resource {
  std::string kind;      // pool, arena, binning, async, cuda, fixed_size, naive
  std::size_t a{}, b{};  // pool: initial; arena: bytes; binning: min_exp, max_exp;
                         // fixed_size: largest block; naive: region bytes (unused here)
};

// Whether this side measures `res` on `w` with `threads` threads (PeerResource::runs, and
// `naive` belongs to rmm-rs alone).
bool runs(Resource const& res, Workload const& w, int threads)
{
  if (res.kind == "naive") { return false; }
  if (res.kind == "cuda") { return threads == 1; }
  if (res.kind == "fixed_size") { return w.largest <= res.a; }
  return true;
}

struct Plan {
  int reps{-1}, warmup{-1};
  std::vector<int> threads;
  std::vector<Resource> resources;
  std::vector<Workload> workloads;
};

[[noreturn]] void fail(std::string const& msg)
{
  std::cerr << "rmm_peer: " << msg << "\n";
  std::exit(2);
}

void check_cuda(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
  }
}

// Reads the next non-empty, non-comment line; false at the end of the file.
bool next_line(std::istream& in, std::string& line, std::size_t& n)
{
  while (std::getline(in, line)) {
    ++n;
    auto start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') { continue; }
    auto end = line.find_last_not_of(" \t\r");
    line     = line.substr(start, end - start + 1);
    return true;
  }
  return false;
}

Plan read_plan(char const* path)
{
  std::ifstream in(path);
  if (!in) { fail(std::string("cannot open ") + path); }
  Plan plan;
  std::string line;
  std::size_t n = 0;
  auto bad = [&](std::string const& why) {
    fail(std::string(path) + " line " + std::to_string(n) + ": " + why + ": `" + line + "`");
  };
  if (!next_line(in, line, n) || line != "rmm-peer-plan 1") { bad("expected `rmm-peer-plan 1`"); }
  while (next_line(in, line, n)) {
    std::istringstream f(line);
    std::string key;
    f >> key;
    if (key == "reps") {
      if (!(f >> plan.reps) || plan.reps < 1) { bad("bad reps"); }
    } else if (key == "warmup") {
      if (!(f >> plan.warmup) || plan.warmup < 0) { bad("bad warmup"); }
    } else if (key == "threads") {
      int t;
      while (f >> t) {
        if (t < 1) { bad("bad thread count"); }
        plan.threads.push_back(t);
      }
    } else if (key == "resource") {
      Resource r;
      f >> r.kind;
      if (r.kind == "pool" || r.kind == "arena" || r.kind == "fixed_size" || r.kind == "naive") {
        if (!(f >> r.a)) { bad("missing size"); }
      } else if (r.kind == "binning") {
        if (!(f >> r.a >> r.b) || r.a > r.b || r.b > 62) { bad("bad bin exponents"); }
      } else if (r.kind != "async" && r.kind != "cuda") {
        bad("unknown resource");
      }
      plan.resources.push_back(r);
    } else if (key == "workload") {
      Workload w;
      std::size_t count = 0;
      if (!(f >> w.name >> w.slots >> count)) { bad("expected `workload NAME SLOTS OPS ...`"); }
      w.ops.reserve(count);
      std::vector<char> live(w.slots, 0);
      for (std::size_t i = 0; i < count; ++i) {
        if (!next_line(in, line, n)) { bad("workload " + w.name + " ends early"); }
        std::istringstream g(line);
        std::string kind;
        Op op{};
        g >> kind >> op.slot;
        if (!g || op.slot >= w.slots) { bad("bad operation"); }
        if (kind == "a") {
          if (!(g >> op.size) || live[op.slot]) { bad("bad allocation"); }
          op.alloc      = true;
          live[op.slot] = 1;
          w.largest     = std::max(w.largest, op.size);
        } else if (kind == "f") {
          if (!live[op.slot]) { bad("free of an empty slot"); }
          op.alloc      = false;
          live[op.slot] = 0;
        } else {
          bad("expected `a SLOT SIZE` or `f SLOT`");
        }
        w.ops.push_back(op);
      }
      if (!next_line(in, line, n) || line != "end") { bad("expected `end`"); }
      if (std::find(live.begin(), live.end(), 1) != live.end()) {
        bad("workload " + w.name + " leaves allocations live");
      }
      plan.workloads.push_back(std::move(w));
    } else {
      bad("unknown record");
    }
  }
  if (plan.reps < 1 || plan.warmup < 0 || plan.threads.empty()) {
    fail(std::string(path) + ": the plan lacks reps, warmup or threads");
  }
  return plan;
}

// One thread's replay of `w` on `stream` through `mr`; returns its wall time from the barrier
// to the end of its stream's work, or throws. Frees what it holds if an operation throws.
// As rmm-rs's `replay_threads` and `replay` (benches/src/lib.rs): the thread waits at the
// barrier, then makes its table of held pointers, then starts its clock.
// With `lat`, each call's latency (ns, one steady_clock pair around it) is appended to it
// (`rmm_peer --latency`); the vector is reserved before the barrier.
double replay(rmm::device_async_resource_ref mr,
              cudaStream_t stream,
              Workload const& w,
              std::barrier<>& start_line,
              std::vector<std::uint64_t>* lat = nullptr)
{
  if (lat != nullptr) { lat->reserve(lat->size() + w.ops.size()); }
  start_line.arrive_and_wait();
  std::vector<std::pair<void*, std::size_t>> held(w.slots, {nullptr, 0});
  cuda::stream_ref s{stream};
  auto const t0 = std::chrono::steady_clock::now();
  std::size_t i = 0;
  try {
    for (; i < w.ops.size(); ++i) {
      auto const& op = w.ops[i];
      auto const c0  = lat != nullptr ? std::chrono::steady_clock::now()
                                      : std::chrono::steady_clock::time_point{};
      if (op.alloc) {
        held[op.slot] = {mr.allocate(s, op.size, 256), op.size};
      } else {
        auto [p, size] = held[op.slot];
        held[op.slot]  = {nullptr, 0};
        mr.deallocate(s, p, size, 256);
      }
      if (lat != nullptr) {
        lat->push_back(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                               c0)
            .count()));
      }
    }
  } catch (std::exception const& e) {
    for (auto [p, size] : held) {
      if (p != nullptr) { mr.deallocate(s, p, size, 256); }
    }
    cudaStreamSynchronize(stream);
    throw std::runtime_error("operation " + std::to_string(i) + " of " +
                             std::to_string(w.ops.size()) + " failed: " + e.what());
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

// One pass: `streams.size()` threads, each replaying `w` on its stream; the slowest wall time.
// The threads start when all of them and this thread have reached the barrier, as in rmm-rs's
// `replay_threads`.
// With `lat`, every thread's call latencies are appended to it after the threads end.
double pass(rmm::device_async_resource_ref mr,
            std::vector<cudaStream_t> const& streams,
            Workload const& w,
            int device,
            std::vector<std::uint64_t>* lat = nullptr)
{
  std::vector<std::vector<std::uint64_t>> own(lat != nullptr ? streams.size() : 0);
  std::barrier<> start_line(static_cast<std::ptrdiff_t>(streams.size()) + 1);
  std::vector<double> walls(streams.size(), 0.0);
  std::vector<std::string> errors(streams.size());
  std::vector<std::thread> threads;
  threads.reserve(streams.size());
  for (std::size_t t = 0; t < streams.size(); ++t) {
    threads.emplace_back([&, t] {
      try {
        check_cuda(cudaSetDevice(device), "cudaSetDevice");
      } catch (std::exception const& e) {
        errors[t] = e.what();
        start_line.arrive_and_drop();
        return;
      }
      try {
        walls[t] = replay(mr, streams[t], w, start_line, lat != nullptr ? &own[t] : nullptr);
      } catch (std::exception const& e) {
        errors[t] = e.what();
      }
    });
  }
  start_line.arrive_and_wait();
  for (auto& th : threads) {
    th.join();
  }
  for (auto const& e : errors) {
    if (!e.empty()) { throw std::runtime_error(e); }
  }
  for (auto const& v : own) {
    lat->insert(lat->end(), v.begin(), v.end());
  }
  return *std::max_element(walls.begin(), walls.end());
}

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  auto const n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

struct CellResult {
  std::optional<double> ns_per_op;
  std::optional<std::uint64_t> peak_reserved;
  std::string status{"ok"};
  // `--latency`: the recorded pass's call count and p50, p99, p99.9, p99.99, max (ns).
  std::uint64_t calls{};
  std::optional<std::array<std::uint64_t, 5>> latency;
};

// `--latency`: each cell is warmed up, then replayed once with a clock pair around each call.
bool g_latency = false;

// The nearest-rank percentiles p50, p99, p99.9, p99.99 and the max of `v` (sorted here), as
// rmm-rs's histograms give them (`hdrhistogram`'s value at quantile).
std::array<std::uint64_t, 5> percentiles(std::vector<std::uint64_t>& v)
{
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(std::max<std::size_t>(rank, 1), v.size()) - 1];
  };
  return {at(0.5), at(0.99), at(0.999), at(0.9999), v.back()};
}

// Runs the passes of one cell with `mr`; `peak` reads the peak reserved bytes.
CellResult passes(rmm::device_async_resource_ref mr,
                  std::function<std::uint64_t()> const& peak,
                  std::vector<cudaStream_t> const& streams,
                  Workload const& w,
                  Plan const& plan,
                  int device)
{
  CellResult r;
  if (g_latency) {
    for (int p = 0; p < plan.warmup; ++p) {
      pass(mr, streams, w, device);
    }
    std::vector<std::uint64_t> lat;
    pass(mr, streams, w, device, &lat);
    r.calls = lat.size();
    if (!lat.empty()) { r.latency = percentiles(lat); }
    return r;
  }
  std::vector<double> samples;
  double const ops = static_cast<double>(w.ops.size() * streams.size());
  for (int p = 0; p < plan.warmup + plan.reps; ++p) {
    double const wall = pass(mr, streams, w, device);
    if (p >= plan.warmup) { samples.push_back(wall / std::max(ops, 1.0)); }
  }
  r.ns_per_op     = median(samples);
  r.peak_reserved = peak();
  return r;
}

CellResult cell(Resource const& res, Workload const& w, int threads, Plan const& plan, int device)
{
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(threads), nullptr);
  CellResult r;
  try {
    for (auto& s : streams) {
      check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    // The resource lives in this scope and is destroyed before the streams.
    rmm::mr::statistics_resource_adaptor stats{rmm::mr::cuda_memory_resource{}};
    auto stats_peak = [&stats] {
      return static_cast<std::uint64_t>(std::max<std::int64_t>(stats.get_bytes_counter().peak, 0));
    };
    if (res.kind == "pool") {
      rmm::mr::pool_memory_resource mr{stats, res.a};
      r = passes(mr, stats_peak, streams, w, plan, device);
    } else if (res.kind == "arena") {
      rmm::mr::arena_memory_resource mr{stats, res.a};
      r = passes(mr, stats_peak, streams, w, plan, device);
    } else if (res.kind == "binning") {
      rmm::mr::pool_memory_resource pool{stats, 0};
      rmm::mr::binning_memory_resource mr{
        pool, static_cast<std::int8_t>(res.a), static_cast<std::int8_t>(res.b)};
      r = passes(mr, stats_peak, streams, w, plan, device);
    } else if (res.kind == "fixed_size") {
      rmm::mr::fixed_size_memory_resource mr{stats, w.largest, 128};
      r = passes(mr, stats_peak, streams, w, plan, device);
    } else if (res.kind == "cuda") {
      r = passes(stats, stats_peak, streams, w, plan, device);
    } else {
      rmm::mr::cuda_async_memory_resource mr{};
      auto pool_peak = [&mr] {
        cuuint64_t high = 0;
        check_cuda(cudaMemPoolGetAttribute(mr.pool_handle(), cudaMemPoolAttrReservedMemHigh, &high),
                   "cudaMemPoolGetAttribute");
        return static_cast<std::uint64_t>(high);
      };
      r = passes(mr, pool_peak, streams, w, plan, device);
    }
  } catch (std::exception const& e) {
    r = CellResult{};
    r.status = std::string("error: ") + e.what();
  }
  cudaDeviceSynchronize();
  for (auto s : streams) {
    if (s != nullptr) { cudaStreamDestroy(s); }
  }
  return r;
}

std::string clean(std::string s)
{
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return s;
}


// ---------------------------------------------------------------------------------------------
// Fragmentation (`rmm_peer --frag PLAN OUT.tsv`, `run.sh peer-frag`): the scenarios of rmm-rs's
// `fragmentation` benchmark (benches/src/frag.rs) with RMM's pool, arena and driver pool.
// host-check: begin (no CUDA below this line until `host-check: end`)

// One value of rmm-rs's generator, with the two sizes it stands for
// (rmm_mr::testing::fragmentation::Draw).
struct Draw {
  std::uint64_t raw{};
  std::size_t small{}, large{};
};

// One operation of the run in which every allocation succeeds (`a` or `f` in the plan).
struct FragEvent {
  bool alloc{};
  std::size_t step{}, stream{}, bytes{};
  bool operator==(FragEvent const&) const = default;
};

// The plan rmm-rs wrote (`examples/peer frag-plan`; format in benches/src/frag.rs).
struct FragPlan {
  std::size_t maximum{};
  std::size_t streams{}, steps{}, budget{}, small_lo{}, small_hi{}, large_lo{}, large_hi{};
  std::size_t large_percent{};
  std::uint64_t seed{};
  std::vector<Draw> draws;
  std::vector<FragEvent> trace;
};

FragPlan read_frag_plan(char const* path)
{
  std::ifstream in(path);
  if (!in) { fail(std::string("cannot open ") + path); }
  FragPlan plan;
  std::string line;
  std::size_t n = 0;
  auto bad = [&](std::string const& why) {
    fail(std::string(path) + " line " + std::to_string(n) + ": " + why + ": `" + line + "`");
  };
  // The next record, which must start with `key`; its fields after the key.
  auto record = [&](std::string const& key) {
    if (!next_line(in, line, n)) { bad("expected `" + key + "`"); }
    auto f = std::make_unique<std::istringstream>(line);
    std::string k;
    *f >> k;
    if (k != key) { bad("expected `" + key + "`"); }
    return f;
  };
  if (!next_line(in, line, n) || line != "rmm-peer-frag 1") { bad("expected `rmm-peer-frag 1`"); }
  if (!(*record("maximum") >> plan.maximum)) { bad("bad maximum"); }
  {
    auto f = record("workload");
    if (!(*f >> plan.streams >> plan.steps >> plan.budget >> plan.small_lo >> plan.small_hi >>
          plan.large_lo >> plan.large_hi >> plan.large_percent >> plan.seed) ||
        plan.streams < 2) {
      bad("expected `workload STREAMS STEPS BUDGET SMALL_LO SMALL_HI LARGE_LO LARGE_HI "
          "LARGE_PERCENT SEED`, at least 2 streams");
    }
  }
  std::size_t count = 0;
  if (!(*record("draws") >> count)) { bad("bad draw count"); }
  plan.draws.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (!next_line(in, line, n)) { bad("the draws end early"); }
    std::istringstream g(line);
    Draw d;
    if (!(g >> d.raw >> d.small >> d.large)) { bad("expected `RAW SMALL LARGE`"); }
    plan.draws.push_back(d);
  }
  if (!(*record("trace") >> count)) { bad("bad trace length"); }
  plan.trace.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (!next_line(in, line, n)) { bad("the trace ends early"); }
    std::istringstream g(line);
    std::string kind;
    FragEvent e;
    if (!(g >> kind >> e.step >> e.stream >> e.bytes) || (kind != "a" && kind != "f")) {
      bad("expected `a|f STEP STREAM BYTES`");
    }
    e.alloc = kind == "a";
    plan.trace.push_back(e);
  }
  if (!next_line(in, line, n) || line != "end") { bad("expected `end`"); }
  return plan;
}

struct FragOutcome {
  std::size_t peak_live{}, peak_reserved{}, reserved_after{}, failed{}, allocations{};
};

// The multi-stream workload's decisions (rmm_mr::testing::fragmentation's `drive`), replayed
// from the plan's draws: per step, `raw % 100 < large_percent` (large?), then the next draw's
// `small` or `large` size; allocate on stream `step % streams` while the bytes live stay
// within the budget (or nothing is live), else free the block `raw % live` (removed as Rust's
// `Vec::swap_remove` does) on stream `(own + 1 + raw % (streams - 1)) % streams`; at the end
// free every block still live, in list order, the same way. `alloc(stream, bytes, step)`
// returns the block, or nullptr when refused for lack of memory (counted; the run goes on);
// `release(block, bytes, stream, step)` frees it (step == steps at the end); `reserved()` is
// read after every step and at the end. If `alloc` or `release` throws, the blocks still live
// are released (errors ignored) and the exception passed on.
template <class Alloc, class Release, class Reserved>
FragOutcome drive(FragPlan const& plan, Alloc&& alloc, Release&& release, Reserved&& reserved)
{
  struct Live {
    void* p;
    std::size_t bytes, stream;
  };
  std::size_t const n = plan.streams;
  std::size_t next_draw = 0;
  auto next = [&]() -> Draw const& {
    if (next_draw >= plan.draws.size()) { throw std::runtime_error("the plan's draws ran out"); }
    return plan.draws[next_draw++];
  };
  auto other_stream = [&](std::size_t own) {
    return (own + 1 + static_cast<std::size_t>(next().raw % (n - 1))) % n;
  };
  std::vector<Live> live;
  std::size_t live_bytes = 0;
  FragOutcome out;
  try {
    for (std::size_t step = 0; step < plan.steps; ++step) {
      bool const large        = next().raw % 100 < plan.large_percent;
      Draw const& size        = next();
      std::size_t const bytes = large ? size.large : size.small;
      if (live_bytes + bytes <= plan.budget || live.empty()) {
        std::size_t const s = step % n;
        void* p             = alloc(s, bytes, step);
        if (p != nullptr) {
          live.push_back({p, bytes, s});
          live_bytes += bytes;
          ++out.allocations;
        } else {
          ++out.failed;
        }
      } else {
        auto const index  = static_cast<std::size_t>(next().raw % live.size());
        Live const victim = live[index];
        live[index]       = live.back();
        live.pop_back();
        std::size_t const other = other_stream(victim.stream);
        live_bytes -= victim.bytes;
        release(victim.p, victim.bytes, other, step);
      }
      out.peak_live     = std::max(out.peak_live, live_bytes);
      out.peak_reserved = std::max(out.peak_reserved, static_cast<std::size_t>(reserved()));
    }
    for (auto& b : live) {
      std::size_t const other = other_stream(b.stream);
      void* p                 = b.p;
      b.p                     = nullptr;
      release(p, b.bytes, other, plan.steps);
    }
    live.clear();
  } catch (...) {
    for (auto const& b : live) {
      if (b.p == nullptr) { continue; }
      try {
        release(b.p, b.bytes, b.stream, plan.steps);
      } catch (...) {
      }
    }
    throw;
  }
  out.reserved_after = static_cast<std::size_t>(reserved());
  out.peak_reserved  = std::max(out.peak_reserved, out.reserved_after);
  return out;
}

std::string describe_event(FragEvent const& e)
{
  return std::string(e.alloc ? "a " : "f ") + std::to_string(e.step) + " " +
         std::to_string(e.stream) + " " + std::to_string(e.bytes);
}

// Replays the plan with an allocator that never refuses and checks that it gives the plan's
// trace, operation for operation; returns the number of operations.
std::size_t check_replay(FragPlan const& plan)
{
  std::vector<FragEvent> events;
  std::uintptr_t fake = 0;
  drive(
    plan,
    [&](std::size_t s, std::size_t bytes, std::size_t step) -> void* {
      events.push_back({true, step, s, bytes});
      fake += 256;
      return reinterpret_cast<void*>(fake);
    },
    [&](void*, std::size_t bytes, std::size_t s, std::size_t step) {
      events.push_back({false, step, s, bytes});
    },
    [] { return std::size_t{0}; });
  for (std::size_t i = 0; i < std::max(events.size(), plan.trace.size()); ++i) {
    if (i >= events.size() || i >= plan.trace.size() || !(events[i] == plan.trace[i])) {
      fail("the replay of the plan's draws departs from its trace at operation " +
           std::to_string(i) + ": replay `" +
           (i < events.size() ? describe_event(events[i]) : std::string("(none)")) +
           "`, plan `" +
           (i < plan.trace.size() ? describe_event(plan.trace[i]) : std::string("(none)")) +
           "`");
    }
  }
  return events.size();
}

// The largest allocation of at most `upper` bytes that `fits(bytes)` serves, to within
// `resolution` (rmm_mr::testing::fragmentation::largest_allocation: a binary search).
template <class Fits>
std::size_t largest_allocation(std::size_t upper, std::size_t resolution, Fits&& fits)
{
  if (upper == 0 || fits(upper)) { return upper; }
  std::size_t ok = 0, refused = upper;
  while (refused - ok > std::max<std::size_t>(resolution, 1)) {
    std::size_t const mid = ok + (refused - ok) / 2;
    if (fits(mid)) {
      ok = mid;
    } else {
      refused = mid;
    }
  }
  return ok;
}

// One resource's figures in one scenario: a line of the results file (FRAG_RESULTS_HEADER in
// benches/src/frag.rs; `-` where a figure does not apply).
struct FragRow {
  FragRow(std::string scenario_, std::string resource_)
    : scenario(std::move(scenario_)), resource(std::move(resource_))
  {
  }
  std::string scenario, resource;
  std::string first{"-"}, second{"-"};  // served, oom
  std::optional<std::uint64_t> reserved, peak_live, peak_reserved, largest, free, failed;
  std::optional<double> seconds;
  std::string status{"ok"};
};

std::string frag_line(FragRow const& r)
{
  auto num = [](std::optional<std::uint64_t> v) { return v ? std::to_string(*v) : "-"; };
  std::string secs = "-";
  if (r.seconds) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", *r.seconds);
    secs = buf;
  }
  std::string status = r.status;
  std::replace_if(
    status.begin(), status.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return "rmm\t" + r.scenario + "\t" + r.resource + "\t" + r.first + "\t" + r.second + "\t" +
         num(r.reserved) + "\t" + num(r.peak_live) + "\t" + num(r.peak_reserved) + "\t" +
         num(r.largest) + "\t" + num(r.free) + "\t" + num(r.failed) + "\t" + secs + "\t" + status;
}

constexpr std::size_t MiB = std::size_t{1} << 20;

// host-check: end

// `bytes` from `mr` on `s` with alignment 256, or nullptr when RMM reports out-of-memory
// (rmm::out_of_memory: the pool's maximum, the arena's size, cudaErrorMemoryAllocation);
// other failures are thrown.
void* try_allocate(rmm::device_async_resource_ref mr, cuda::stream_ref s, std::size_t bytes)
{
  try {
    return mr.allocate(s, bytes, 256);
  } catch (rmm::out_of_memory const&) {
    return nullptr;
  }
}

// Builds RMM's resource `kind` bounded by `max` as rmm-rs's `frag::subject` builds its own
// (pool: over a statistics adaptor over the CUDA resource, initial 0, maximum `max`; arena:
// over the same, size `max`; cuda_async: RMM's defaults, no bound) and calls
// `f(mr, reserved)`, `reserved()` reading the bytes it holds from the device now (the
// adaptor's current bytes, or the pool's ReservedMemCurrent).
template <class F>
void with_frag_resource(std::string const& kind, std::size_t max, F&& f)
{
  rmm::mr::statistics_resource_adaptor stats{rmm::mr::cuda_memory_resource{}};
  std::function<std::uint64_t()> const held = [&stats] {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(stats.get_bytes_counter().value, 0));
  };
  if (kind == "pool") {
    rmm::mr::pool_memory_resource mr{stats, std::size_t{0}, std::optional<std::size_t>{max}};
    f(mr, held);
  } else if (kind == "arena") {
    rmm::mr::arena_memory_resource mr{stats, std::optional<std::size_t>{max}};
    f(mr, held);
  } else {
    rmm::mr::cuda_async_memory_resource mr{};
    std::function<std::uint64_t()> const pool_reserved = [&mr] {
      cuuint64_t bytes = 0;
      check_cuda(cudaMemPoolGetAttribute(mr.pool_handle(), cudaMemPoolAttrReservedMemCurrent, &bytes),
                 "cudaMemPoolGetAttribute");
      return static_cast<std::uint64_t>(bytes);
    };
    f(mr, pool_reserved);
  }
}

char const* const FRAG_KINDS[] = {"pool", "arena", "cuda_async"};

// RMM issue 1957 on RMM's pool: initial 2 MiB, maximum 64 MiB over the CUDA resource, one
// allocation of 64 MiB on the legacy stream.
FragRow frag_1957()
{
  FragRow r{"1957", "pool"};
  try {
    cuda::stream_ref const legacy{cudaStreamLegacy};
    rmm::mr::pool_memory_resource mr{
      rmm::mr::cuda_memory_resource{}, 2 * MiB, std::optional<std::size_t>{64 * MiB}};
    void* p = try_allocate(mr, legacy, 64 * MiB);
    r.first = p != nullptr ? "served" : "oom";
    if (p != nullptr) { mr.deallocate(legacy, p, 64 * MiB, 256); }
    check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
  } catch (std::exception const& e) {
    r.status = std::string("error: ") + e.what();
  }
  return r;
}

// RMM issue 496, scaled: 8 MiB allocations on the legacy stream while fewer than 75 % of `max`
// are held, all freed, then two of `max / 5 * 2` rounded down to 256 B; the bytes reserved
// with both held.
FragRow frag_496(std::string const& kind, std::size_t max)
{
  FragRow r{"496", kind};
  std::size_t const large = max / 5 * 2 / 256 * 256;
  try {
    with_frag_resource(
      kind,
      max,
      [&](rmm::device_async_resource_ref mr, std::function<std::uint64_t()> const& reserved) {
        cuda::stream_ref const legacy{cudaStreamLegacy};
        std::vector<void*> small;
        while (small.size() * 8 * MiB < max / 4 * 3) {
          small.push_back(mr.allocate(legacy, 8 * MiB, 256));
        }
        for (void* p : small) {
          mr.deallocate(legacy, p, 8 * MiB, 256);
        }
        void* a    = try_allocate(mr, legacy, large);
        void* b    = try_allocate(mr, legacy, large);
        r.reserved = reserved();
        for (void* p : {a, b}) {
          if (p != nullptr) { mr.deallocate(legacy, p, large, 256); }
        }
        check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
        r.first  = a != nullptr ? "served" : "oom";
        r.second = b != nullptr ? "served" : "oom";
      });
  } catch (std::exception const& e) {
    r        = FragRow{"496", kind};
    r.status = std::string("error: ") + e.what();
  }
  return r;
}

// The multi-stream workload on `streams`, then the largest allocation served on the first
// (binary search from `max` down, 2 MiB resolution); the time of both.
FragRow frag_multi_stream(std::string const& kind,
                          FragPlan const& plan,
                          std::vector<cudaStream_t> const& streams)
{
  FragRow r{"multi_stream", kind};
  std::size_t const max = plan.maximum;
  try {
    with_frag_resource(
      kind,
      max,
      [&](rmm::device_async_resource_ref mr, std::function<std::uint64_t()> const& reserved) {
        auto const t0 = std::chrono::steady_clock::now();
        FragOutcome const out = drive(
          plan,
          [&](std::size_t s, std::size_t bytes, std::size_t) -> void* {
            return try_allocate(mr, cuda::stream_ref{streams[s]}, bytes);
          },
          [&](void* p, std::size_t bytes, std::size_t s, std::size_t) {
            mr.deallocate(cuda::stream_ref{streams[s]}, p, bytes, 256);
          },
          [&] { return reserved(); });
        cuda::stream_ref const first{streams[0]};
        std::size_t const largest = largest_allocation(max, 2 * MiB, [&](std::size_t bytes) {
          void* p = try_allocate(mr, first, bytes);
          if (p == nullptr) { return false; }
          mr.deallocate(first, p, bytes, 256);
          return true;
        });
        double const seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (auto s : streams) {
          check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        }
        r.peak_live     = out.peak_live;
        r.peak_reserved = out.peak_reserved;
        r.largest       = largest;
        r.free          = max;
        r.failed        = out.failed;
        r.seconds       = seconds;
      });
  } catch (std::exception const& e) {
    r        = FragRow{"multi_stream", kind};
    r.status = std::string("error: ") + e.what();
  }
  return r;
}

// The device this program runs on, in words (and its number in `device`); exits without one.
std::string device_description(int& device)
{
  cudaDeviceProp prop{};
  int driver = 0, runtime = 0;
  try {
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    check_cuda(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
    check_cuda(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  } catch (std::exception const& e) {
    fail(std::string("no usable GPU: ") + e.what());
  }
  std::size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  std::ostringstream dev;
  dev << prop.name << "; driver CUDA " << driver / 1000 << "." << (driver % 1000) / 10
      << "; runtime (this program) " << runtime / 1000 << "." << (runtime % 1000) / 10
      << "; memory " << total_b / (1 << 20) << " MiB total, " << free_b / (1 << 20) << " MiB free";
  return dev.str();
}

// `rmm_peer --frag PLAN OUT.tsv`: checks the replay of the plan's draws against its trace,
// then measures issue 1957 (the pool), issue 496 and the multi-stream workload (the pool, the
// arena, the driver pool), one result line each.
int run_frag(char const* plan_path, char const* out_path)
{
  FragPlan const plan   = read_frag_plan(plan_path);
  std::size_t const ops = check_replay(plan);
  std::ofstream out(out_path);
  if (!out) { fail(std::string("cannot create ") + out_path); }
  int device            = 0;
  std::string const dev = device_description(device);
  out << "# side: rmm " << RMM_VERSION << " (librmm-cu13 wheel, C++ " << __cplusplus << ")\n";
  out << "# device: " << dev << "\n";
  out << "# rmm_peer: its replay of the plan's " << plan.draws.size() << " draws gives the plan's "
      << ops << " operations\n";
  // FRAG_RESULTS_HEADER in benches/src/frag.rs.
  out << "side\tscenario\tresource\tfirst\tsecond\treserved\tpeak_live\tpeak_reserved\tlargest\tfree\tfailed\tseconds\tstatus\n";
  out.flush();
  std::cout << "rmm_peer --frag: RMM " << RMM_VERSION << " on " << dev << "; maximum "
            << plan.maximum / MiB << " MiB; replay checked (" << ops << " operations)\n";

  int failed = 0;
  auto emit  = [&](FragRow const& r) {
    if (r.status != "ok") { ++failed; }
    std::string const line = frag_line(r);
    out << line << "\n";
    out.flush();
    std::cout << line << "\n";
  };
  std::cerr << "[rmm_peer] 1957 / pool\n";
  emit(frag_1957());
  for (char const* kind : FRAG_KINDS) {
    std::cerr << "[rmm_peer] 496 / " << kind << "\n";
    emit(frag_496(kind, plan.maximum));
  }
  // The workload's streams, made once for every resource (as rmm-rs's side does).
  std::vector<cudaStream_t> streams(plan.streams, nullptr);
  std::string stream_error;
  try {
    for (auto& s : streams) {
      check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    }
  } catch (std::exception const& e) {
    stream_error = e.what();
  }
  for (char const* kind : FRAG_KINDS) {
    std::cerr << "[rmm_peer] multi_stream / " << kind << "\n";
    if (stream_error.empty()) {
      emit(frag_multi_stream(kind, plan, streams));
    } else {
      FragRow r{"multi_stream", kind};
      r.status = "error: " + stream_error;
      emit(r);
    }
  }
  cudaDeviceSynchronize();
  for (auto s : streams) {
    if (s != nullptr) { cudaStreamDestroy(s); }
  }
  std::cout << "peer-frag run (rmm): " << failed << " row(s) failed\n";
  return 0;
}

// `rmm_peer --latency PLAN OUT.tsv`: the sub-allocator cells' latencies, in the format of
// rmm-rs's `examples/peer latency` (benches/src/peer_latency.rs).
int run_latency(Plan const& plan, std::ofstream& out)
{
  int device            = 0;
  std::string const dev = device_description(device);
  out << "# side: rmm " << RMM_VERSION << " (librmm-cu13 wheel, C++ " << __cplusplus << ")\n";
  out << "# device: " << dev << "\n";
  out << "side\tworkload\tresource\tthreads\tops\tp50\tp99\tp99.9\tp99.99\tmax\tstatus\n";
  out.flush();
  for (auto const& w : plan.workloads) {
    for (auto const& res : plan.resources) {
      if (res.kind != "pool" && res.kind != "arena" && res.kind != "binning" &&
          res.kind != "fixed_size") {
        continue;
      }
      for (int t : plan.threads) {
        if (!runs(res, w, t)) { continue; }
        std::cerr << "[rmm_peer] latency " << w.name << " / " << res.kind << " / " << t << "\n";
        CellResult const r = cell(res, w, t, plan, device);
        std::ostringstream line;
        line << "rmm\t" << w.name << "\t" << res.kind << "\t" << t << "\t" << r.calls;
        for (int k = 0; k < 5; ++k) {
          line << "\t";
          if (r.latency) {
            line << (*r.latency)[k];
          } else {
            line << "-";
          }
        }
        line << "\t" << (r.latency || r.status != "ok" ? clean(r.status) : "error: no calls");
        out << line.str() << "\n";
        out.flush();
        std::cout << line.str() << "\n";
      }
    }
  }
  return 0;
}

// End to end (`rmm_peer --replay LOG.csv`, `run.sh peer-replay`): an RMM-format memory-event
// log replayed through RMM's pool as `rmm-replay --resource pool` replays it through rmm-rs's
// (crates/rmm-replay: plan.rs, replay.rs, target.rs). The log is read and planned first,
// untimed: columns found by header name; `allocate failure` rows counted, not replayed; a
// zero-byte allocation at the null pointer skipped; a free matched to the live allocation of
// its pointer (one the log never allocated counted and skipped), freed with that size on the
// free's own stream; a log that contradicts itself (a pointer allocated twice, a free of
// another size, a non-empty allocation at null) is an error naming its line. Stream handles
// are read as hex: 0 is the default stream, 0x1 the legacy and 0x2 the per-thread default
// stream, every other handle a stream created here with default flags. The resource:
// pool_memory_resource (initial size 0, no maximum) over statistics_resource_adaptor over
// cuda_memory_resource, as rmm-replay's `pool` (over its counting adaptor). The replay runs
// every step in log order on one thread started for it, reading pool_size() after each step
// (rmm-replay reads its pool's size there too); the wall time runs from the release of that
// thread to its join, as rmm-replay's. What the log leaves allocated is freed afterwards,
// untimed. Prints one line: replay<TAB>steps=N<TAB>wall_ns=W<TAB>peak_reserved=R
// <TAB>peak_in_use=U<TAB>status=ok (or status=error: WHY, wall_ns=-).

struct ReplayStep {
  bool alloc;
  std::uint32_t slot;
  std::uint32_t stream;  // index into ReplayLog::streams
  std::size_t size;
  std::size_t line;
};

struct ReplayLog {
  std::vector<ReplayStep> steps;
  std::vector<std::size_t> slot_sizes;
  std::vector<std::uint32_t> slot_streams;
  std::vector<std::uint64_t> streams;  // logged handles, in order of first appearance
  std::vector<std::uint64_t> in_use;   // bytes in use (as requested) after each step
  std::size_t rows{}, failures{}, unmatched_frees{}, threads{};
};

std::string trimmed(std::string const& s)
{
  auto const start = s.find_first_not_of(" \t\r");
  if (start == std::string::npos) { return {}; }
  auto const end = s.find_last_not_of(" \t\r");
  return s.substr(start, end - start + 1);
}

std::vector<std::string> split_fields(std::string const& line)
{
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) {
    fields.push_back(trimmed(field));
  }
  if (!line.empty() && line.back() == ',') { fields.emplace_back(); }
  return fields;
}

// Hex digits with an optional 0x/0X, fitting 64 bits.
bool parse_hex_u64(std::string text, std::uint64_t& value)
{
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text = text.substr(2);
  }
  if (text.empty() || text.size() > 16) { return false; }
  value = 0;
  for (char c : text) {
    int d = -1;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    }
    if (d < 0) { return false; }
    value = value * 16 + static_cast<std::uint64_t>(d);
  }
  return true;
}

bool parse_dec_u64(std::string const& text, std::uint64_t& value)
{
  if (text.empty() || text.size() > 19) { return false; }
  value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') { return false; }
    value = value * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return true;
}

ReplayLog read_replay_log(char const* path)
{
  std::ifstream in(path);
  if (!in) { fail(std::string("cannot open ") + path); }
  std::string line;
  std::size_t n = 0;
  auto bad      = [&](std::string const& why) {
    fail(std::string(path) + " line " + std::to_string(n) + ": " + why + ": `" + line + "`");
  };
  if (!std::getline(in, line)) { fail(std::string(path) + ": empty log (no header line)"); }
  ++n;
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) { line = line.substr(3); }
  auto const header = split_fields(line);
  auto column       = [&](char const* name) {
    auto const it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) { bad(std::string("the header lacks the column ") + name); }
    return static_cast<std::size_t>(it - header.begin());
  };
  std::size_t const c_thread = column("Thread"), c_action = column("Action"),
                    c_pointer = column("Pointer"), c_size = column("Size"),
                    c_stream = column("Stream");

  ReplayLog log;
  std::unordered_map<std::uint64_t, std::uint32_t> stream_index;
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::size_t>> live;  // slot, line
  std::unordered_set<std::uint64_t> threads;
  std::uint64_t in_use = 0;
  while (std::getline(in, line)) {
    ++n;
    if (trimmed(line).empty()) { continue; }
    auto const f = split_fields(line);
    if (f.size() != header.size()) { bad("a row of another number of fields than the header"); }
    ++log.rows;
    std::uint64_t thread = 0, pointer = 0, size = 0, stream = 0;
    if (!parse_dec_u64(f[c_thread], thread)) { bad("bad Thread"); }
    if (f[c_pointer] != "(nil)" && !parse_hex_u64(f[c_pointer], pointer)) { bad("bad Pointer"); }
    if (!parse_dec_u64(f[c_size], size)) { bad("bad Size"); }
    if (!parse_hex_u64(f[c_stream], stream)) { bad("bad Stream"); }
    std::string const& action = f[c_action];
    ReplayStep step{};
    step.line = n;
    step.size = static_cast<std::size_t>(size);
    if (action == "allocate failure") {
      ++log.failures;
      continue;
    } else if (action == "allocate") {
      if (pointer == 0) {
        if (size == 0) { continue; }
        bad("a successful allocation at the null pointer");
      }
      if (live.count(pointer) != 0) {
        bad("allocates a pointer still allocated since line " +
            std::to_string(live[pointer].second));
      }
      step.alloc = true;
      step.slot  = static_cast<std::uint32_t>(log.slot_sizes.size());
      live.emplace(pointer, std::make_pair(step.slot, n));
      in_use += size;
    } else if (action == "free") {
      auto const it = live.find(pointer);
      if (it == live.end()) {
        ++log.unmatched_frees;
        continue;
      }
      if (log.slot_sizes[it->second.first] != size) {
        bad("frees another size than line " + std::to_string(it->second.second) + " allocated");
      }
      step.alloc = false;
      step.slot  = it->second.first;
      live.erase(it);
      in_use -= size;
    } else {
      bad("unknown Action");
    }
    threads.insert(thread);
    auto const s = stream_index.emplace(stream, static_cast<std::uint32_t>(log.streams.size()));
    if (s.second) { log.streams.push_back(stream); }
    step.stream = s.first->second;
    if (step.alloc) {
      log.slot_sizes.push_back(step.size);
      log.slot_streams.push_back(step.stream);
    }
    log.steps.push_back(step);
    log.in_use.push_back(in_use);
  }
  log.threads = threads.size();
  return log;
}

// `rmm_peer --replay LOG.csv`: the log replayed once through RMM's pool; prints the replay line.
int run_replay(char const* path)
{
  ReplayLog const log = read_replay_log(path);
  int device          = 0;
  std::string const dev = device_description(device);  // creates the context, untimed
  std::size_t const allocations = log.slot_sizes.size();
  std::cout << "rmm_peer --replay: RMM " << RMM_VERSION << " on " << dev << "\n"
            << "rmm_peer --replay: " << path << ": " << log.rows << " rows (" << log.threads
            << " thread(s), replayed on one), " << log.streams.size() << " stream(s), "
            << allocations << " allocations and " << (log.steps.size() - allocations)
            << " frees replayed, " << log.failures << " failures in the log, "
            << log.unmatched_frees << " frees without allocation (skipped)\n";

  std::vector<cudaStream_t> streams(log.streams.size(), nullptr);
  std::vector<cudaStream_t> owned;
  std::string status = "ok";
  double wall_ns     = -1.0;
  std::uint64_t peak_reserved = 0, peak_in_use = 0;
  try {
    for (std::size_t i = 0; i < log.streams.size(); ++i) {
      auto const h = log.streams[i];
      if (h == 0) {
        streams[i] = cudaStream_t{};
      } else if (h == 1) {
        streams[i] = cudaStreamLegacy;
      } else if (h == 2) {
        streams[i] = cudaStreamPerThread;
      } else {
        cudaStream_t s{};
        check_cuda(cudaStreamCreate(&s), "cudaStreamCreate");
        owned.push_back(s);
        streams[i] = s;
      }
    }
    // The resource lives in this scope and is destroyed before the streams.
    rmm::mr::statistics_resource_adaptor stats{rmm::mr::cuda_memory_resource{}};
    rmm::mr::pool_memory_resource pool{stats, std::size_t{0}};
    rmm::device_async_resource_ref mr{pool};
    std::vector<void*> pointers(allocations, nullptr);
    std::vector<std::uint64_t> reserved(log.steps.size(), 0);
    std::size_t ran = 0;
    std::string error;
    std::atomic<bool> go{false};
    std::thread worker([&] {
      go.wait(false);
      try {
        for (; ran < log.steps.size(); ++ran) {
          auto const& step = log.steps[ran];
          cuda::stream_ref s{streams[step.stream]};
          if (step.alloc) {
            pointers[step.slot] = mr.allocate(s, step.size, 256);
          } else {
            void* p             = pointers[step.slot];
            pointers[step.slot] = nullptr;
            mr.deallocate(s, p, step.size, 256);
          }
          reserved[ran] = pool.pool_size();
        }
      } catch (std::exception const& e) {
        auto const& step = log.steps[ran];
        error = std::string(step.alloc ? "allocating " : "freeing ") + std::to_string(step.size) +
                " bytes at line " + std::to_string(step.line) + ": " + e.what();
      }
    });
    auto const t0 = std::chrono::steady_clock::now();
    go.store(true);
    go.notify_one();
    worker.join();
    wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t i = 0; i < ran; ++i) {
      peak_reserved = std::max(peak_reserved, reserved[i]);
      peak_in_use   = std::max(peak_in_use, log.in_use[i]);
    }
    // What the log (or a failed replay) left allocated, on the stream it was allocated on.
    for (std::size_t slot = 0; slot < pointers.size(); ++slot) {
      if (pointers[slot] != nullptr) {
        cuda::stream_ref s{streams[log.slot_streams[slot]]};
        mr.deallocate(s, pointers[slot], log.slot_sizes[slot], 256);
      }
    }
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (!error.empty()) { status = "error: " + error; }
  } catch (std::exception const& e) {
    status = std::string("error: ") + e.what();
  }
  for (auto s : owned) {
    cudaStreamDestroy(s);
  }
  std::ostringstream line;
  line << "replay\tsteps=" << log.steps.size() << "\twall_ns=";
  if (status == "ok") {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f", wall_ns);
    line << buf;
  } else {
    line << "-";
  }
  line << "\tpeak_reserved=" << peak_reserved << "\tpeak_in_use=" << peak_in_use
       << "\tstatus=" << clean(status);
  std::cout << line.str() << std::endl;
  return status == "ok" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  bool const frag   = argc == 4 && std::string(argv[1]) == "--frag";
  bool const replay = argc == 3 && std::string(argv[1]) == "--replay";
  g_latency         = argc == 4 && std::string(argv[1]) == "--latency";
  if ((argc != 3 && !frag && !g_latency) ||
      (argc == 3 && std::string(argv[1]).rfind("--", 0) == 0 && !replay)) {
    std::cerr << "usage: rmm_peer PLAN OUT.tsv\n       rmm_peer --frag PLAN OUT.tsv\n"
                 "       rmm_peer --latency PLAN OUT.tsv\n       rmm_peer --replay LOG.csv\n";
    return 2;
  }
  if (frag) { return run_frag(argv[2], argv[3]); }
  if (replay) { return run_replay(argv[2]); }
  if (g_latency) { ++argv; }
  Plan const plan = read_plan(argv[1]);
  std::ofstream out(argv[2]);
  if (!out) { fail(std::string("cannot create ") + argv[2]); }
  if (g_latency) { return run_latency(plan, out); }

  int device            = 0;
  std::string const dev = device_description(device);
  out << "# side: rmm " << RMM_VERSION << " (librmm-cu13 wheel, C++ " << __cplusplus << ")\n";
  out << "# device: " << dev << "\n";
  out << "side\tworkload\tresource\tthreads\tns_per_op\tpeak_reserved\tstatus\n";
  out.flush();
  std::cout << "rmm_peer: RMM " << RMM_VERSION << " on " << dev << "\n";

  int failed = 0;
  for (auto const& w : plan.workloads) {
    for (auto const& res : plan.resources) {
      for (int t : plan.threads) {
        if (!runs(res, w, t)) { continue; }
        std::cerr << "[rmm_peer] " << w.name << " / " << res.kind << " / " << t << " thread(s)\n";
        CellResult const r = cell(res, w, t, plan, device);
        if (r.status != "ok") { ++failed; }
        std::ostringstream line;
        line << "rmm\t" << w.name << "\t" << res.kind << "\t" << t << "\t";
        if (r.ns_per_op) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%.1f", *r.ns_per_op);
          line << buf;
        } else {
          line << "-";
        }
        line << "\t";
        if (r.peak_reserved) {
          line << *r.peak_reserved;
        } else {
          line << "-";
        }
        line << "\t" << clean(r.status);
        out << line.str() << "\n";
        out.flush();
        std::cout << line.str() << "\n";
      }
    }
  }
  std::cout << "peer run (rmm): " << failed << " cell(s) failed\n";
  return 0;
}
