// rmm_peer: the RMM C++ side of rmm-rs's peer comparison (`bash gpu-bundle/run.sh peer`).
//
// usage: rmm_peer PLAN OUT.tsv
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
// Built on the GPU machine by run.sh with nvcc against the librmm-cu13 and rapids-logger
// wheels (C++20, the wheel's CCCL headers ahead of the toolkit's). Host code only.

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
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
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
double replay(rmm::device_async_resource_ref mr,
              cudaStream_t stream,
              Workload const& w,
              std::barrier<>& start_line)
{
  std::vector<std::pair<void*, std::size_t>> held(w.slots, {nullptr, 0});
  cuda::stream_ref s{stream};
  start_line.arrive_and_wait();
  auto const t0 = std::chrono::steady_clock::now();
  std::size_t i = 0;
  try {
    for (; i < w.ops.size(); ++i) {
      auto const& op = w.ops[i];
      if (op.alloc) {
        held[op.slot] = {mr.allocate(s, op.size, 256), op.size};
      } else {
        auto [p, size] = held[op.slot];
        held[op.slot]  = {nullptr, 0};
        mr.deallocate(s, p, size, 256);
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
double pass(rmm::device_async_resource_ref mr,
            std::vector<cudaStream_t> const& streams,
            Workload const& w,
            int device)
{
  std::barrier<> start_line(static_cast<std::ptrdiff_t>(streams.size()));
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
        walls[t] = replay(mr, streams[t], w, start_line);
      } catch (std::exception const& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  for (auto const& e : errors) {
    if (!e.empty()) { throw std::runtime_error(e); }
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
};

// Runs the passes of one cell with `mr`; `peak` reads the peak reserved bytes.
CellResult passes(rmm::device_async_resource_ref mr,
                  std::function<std::uint64_t()> const& peak,
                  std::vector<cudaStream_t> const& streams,
                  Workload const& w,
                  Plan const& plan,
                  int device)
{
  CellResult r;
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

}  // namespace

int main(int argc, char** argv)
{
  if (argc != 3) {
    std::cerr << "usage: rmm_peer PLAN OUT.tsv\n";
    return 2;
  }
  Plan const plan = read_plan(argv[1]);
  std::ofstream out(argv[2]);
  if (!out) { fail(std::string("cannot create ") + argv[2]); }

  int device = 0;
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
  out << "# side: rmm " << RMM_VERSION << " (librmm-cu13 wheel, C++ " << __cplusplus << ")\n";
  out << "# device: " << dev.str() << "\n";
  out << "side\tworkload\tresource\tthreads\tns_per_op\tpeak_reserved\tstatus\n";
  out.flush();
  std::cout << "rmm_peer: RMM " << RMM_VERSION << " on " << dev.str() << "\n";

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
