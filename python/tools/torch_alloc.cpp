// torch_alloc.cpp: the allocator alone, without Python (`bash gpu-bundle/run.sh torch-alloc`):
// in one process, allocate+free pairs on PyTorch's default stream through
//   torch:  PyTorch's caching allocator, c10::cuda::CUDACachingAllocator::raw_alloc_with_stream
//           and raw_delete (what torch.empty and del reach, without the tensor);
//   rmm-rs: rmm_rs_torch_alloc and rmm_rs_torch_free, the hooks torch's
//           CUDAPluggableAllocator calls (librmm_capi.so, the pool of 4 GiB that
//           bench_torch.py configures; statistics off unless --statistics).
// Neither side includes the wrapper around it (torch's Tensor, or the CUDAPluggableAllocator's
// own map of allocations). Sizes 1 KiB, 256 KiB, 4 MiB and 64 MiB; after a warm-up of each
// size on each side (the caches filled), ROUNDS rounds, each timing PAIRS pairs of one size on
// one side, then on the other, the side that goes first alternating (ABBA) and the sizes
// rotating; a figure is the median over the rounds of ns per pair.
//
//   torch_alloc [--pairs N] [--rounds N] [--statistics]
//
// Prints a table, then last "torch-alloc: N sizes, M above 1.00" (M: sizes where rmm-rs's
// median is above torch's). Compiled on the GPU machine by run.sh against python3's torch
// (headers and libc10, libc10_cuda) and capi/librmm_capi.so; host code only.

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include "rmm_rs.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Size {
  char const* label;
  std::size_t bytes;
};

constexpr Size SIZES[] = {
  {"1 KiB", std::size_t{1} << 10},
  {"256 KiB", std::size_t{256} << 10},
  {"4 MiB", std::size_t{4} << 20},
  {"64 MiB", std::size_t{64} << 20},
};
constexpr int NSIZES = sizeof(SIZES) / sizeof(SIZES[0]);

// PyTorch's default stream: what torch.empty uses unless a stream is current.
cudaStream_t const STREAM = nullptr;

double torch_pairs(std::size_t bytes, long pairs)
{
  auto const t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < pairs; ++i) {
    void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, STREAM);
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(pairs);
}

double rmm_rs_pairs(std::size_t bytes, long pairs)
{
  auto const size = static_cast<ssize_t>(bytes);
  auto const t0   = std::chrono::steady_clock::now();
  for (long i = 0; i < pairs; ++i) {
    // Throws (a std::bad_alloc) on failure, as torch expects of the hook.
    void* p = rmm_rs_torch_alloc(size, 0, STREAM);
    rmm_rs_torch_free(p, size, 0, STREAM);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(pairs);
}

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  auto const n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

long arg_value(int argc, char** argv, char const* flag, long fallback)
{
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) {
      char* end   = nullptr;
      long const v = std::strtol(argv[i + 1], &end, 10);
      if (end == argv[i + 1] || *end != '\0' || v < 1) {
        throw std::invalid_argument(std::string(flag) + " needs a positive whole number");
      }
      return v;
    }
  }
  return fallback;
}

int run(int argc, char** argv)
{
  long const pairs  = arg_value(argc, argv, "--pairs", 20000);
  long const rounds = arg_value(argc, argv, "--rounds", 10);
  bool statistics   = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--statistics") == 0) { statistics = true; }
  }

  // torch's allocator, as torch's lazy CUDA initialization sets it up.
  int const devices = static_cast<int>(c10::cuda::device_count());
  if (devices < 1) { throw std::runtime_error("no CUDA device"); }
  c10::cuda::set_device(0);
  c10::cuda::CUDACachingAllocator::init(devices);

  // rmm-rs, as bench_torch.py's rmm-rs pool: a pool of 4 GiB on device 0.
  if (rmm_rs_abi_version() != RMM_RS_ABI_VERSION) {
    throw std::runtime_error("librmm_capi.so has another ABI version than rmm_rs.h");
  }
  rmm_rs_options options;
  rmm_rs_options_init(&options);
  options.resource          = RMM_RS_RESOURCE_POOL;
  options.initial_pool_size = std::uint64_t{4} << 30;
  options.statistics        = statistics ? 1 : 0;
  int32_t const device0     = 0;
  options.num_devices       = 1;
  options.devices           = &device0;
  if (rmm_rs_configure(&options) != RMM_RS_SUCCESS) {
    throw std::runtime_error(std::string("rmm_rs_configure: ") + rmm_rs_last_error());
  }

  std::printf("torch-alloc: rmm-rs %s (pool of 4 GiB, statistics %s) against torch's caching "
              "allocator (%s); %ld pairs a round, %ld rounds, ABBA\n",
              rmm_rs_version(),
              statistics ? "on" : "off",
              c10::cuda::CUDACachingAllocator::name().c_str(),
              pairs,
              rounds);
  for (auto const& s : SIZES) {  // warm-up: torch's cache and the pool's blocks
    torch_pairs(s.bytes, 1000);
    rmm_rs_pairs(s.bytes, 1000);
  }
  std::vector<std::vector<double>> ours(NSIZES), theirs(NSIZES);
  for (long r = 0; r < rounds; ++r) {
    for (int k = 0; k < NSIZES; ++k) {
      int const i = static_cast<int>((k + r) % NSIZES);
      // Pairs of rounds alternate which side goes first: torch, rmm-rs | rmm-rs, torch | ...
      if (r % 2 == 0) {
        theirs[i].push_back(torch_pairs(SIZES[i].bytes, pairs));
        ours[i].push_back(rmm_rs_pairs(SIZES[i].bytes, pairs));
      } else {
        ours[i].push_back(rmm_rs_pairs(SIZES[i].bytes, pairs));
        theirs[i].push_back(torch_pairs(SIZES[i].bytes, pairs));
      }
    }
  }

  std::printf("\n| size | torch ns/pair | rmm-rs ns/pair | rmm-rs / torch | torch min-max | "
              "rmm-rs min-max |\n|---|---:|---:|---:|---:|---:|\n");
  int above = 0;
  for (int i = 0; i < NSIZES; ++i) {
    double const t = median(theirs[i]), o = median(ours[i]);
    if (!(o <= t)) { ++above; }
    auto const [tmin, tmax] = std::minmax_element(theirs[i].begin(), theirs[i].end());
    auto const [omin, omax] = std::minmax_element(ours[i].begin(), ours[i].end());
    std::printf("| %s | %.1f | %.1f | %.2f | %.1f-%.1f | %.1f-%.1f |\n",
                SIZES[i].label,
                t,
                o,
                o / t,
                *tmin,
                *tmax,
                *omin,
                *omax);
  }
  std::printf("\ntorch-alloc: %d sizes, %d above 1.00\n", NSIZES, above);
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  try {
    return run(argc, argv);
  } catch (std::exception const& e) {
    std::printf("torch_alloc: %s\ntorch-alloc: 0 sizes, 0 above 1.00 (error)\n", e.what());
    return 1;
  }
}
