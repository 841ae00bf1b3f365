#!/usr/bin/env bash
# run.sh: runs an rmm-rs GPU bundle (made by `cargo xtask gpu bundle`) on a GPU machine.
# Needs bash and coreutils only (no Rust). Source: xtask/runner/run.sh in the rmm-rs repo.
#
# usage: run.sh [test] [FILTER...]     every bin/* test binary, once per stream mode, with
#                                      --test-threads=1 FILTER...; last line:
#                                      "gpu: N passed, M failed, K skipped"
#        run.sh bench [ARGS...]        every bench/* binary once, with --bench ARGS...
#        run.sh frag [ARGS...]         the fragmentation benchmark only (bench/*--fragmentation):
#                                      its tables of RMM issues 1957, 496 and 2039 and growth
#                                      costs
#        run.sh peer [ARGS...]         the peer comparison with RMM C++ (a bundle made with
#                                      `cargo xtask gpu bundle --peer`): compiles
#                                      peer/rmm_peer.cpp with nvcc against the bundled librmm
#                                      and rapids-logger wheels, then runs examples/peer plan
#                                      (with ARGS, e.g. --quick), rmm_peer (RMM C++), examples/peer
#                                      run (rmm-rs) and examples/peer report, whose last line is
#                                      "peer: N cells compared, M failed"; then the plan's `cuda`
#                                      and `async` cells again, alone, each side in
#                                      RMM_PEER_WRAP_ROUNDS (default 3; 0: skip) fresh processes
#                                      in ABBA order (RMM, rmm-rs, rmm-rs, RMM, ...), reduced by
#                                      examples/peer report-rounds to per-cell medians; last line
#                                      "peer-wrappers: N cells, M above 1.00"
#        run.sh peer-wrap [ROUNDS]     those wrapper rounds alone (ROUNDS a side, default 3), on a
#                                      fresh plan, reusing the rmm_peer an earlier `peer`
#                                      compiled; last line "peer-wrappers: N cells, M above 1.00"
#        run.sh peer-ab BEFORE_PEER_BINARY [ROUNDS] [ARGS...]
#                                      before and after, rmm-rs only (no RMM C++, no wheels, no
#                                      nvcc: any bundle): examples/peer plan (ARGS, e.g. --quick)
#                                      cut to its sub-allocator resources (pool, arena, binning,
#                                      fixed_size), run by BEFORE_PEER_BINARY (an examples/peer
#                                      built from an older tree) and by this bundle's
#                                      examples/peer in alternating fresh processes, ABBA order
#                                      (before, after, after, before, ...), ROUNDS a side
#                                      (default 3), reduced by examples/peer report-ab: per cell
#                                      both sides' medians, after / before, peak reserved memory;
#                                      last line "peer-ab: N cells, M above 1.10"
#        run.sh peer-latency [ARGS...]  per-call latency percentiles of the sub-allocator cells on
#                                      both sides (a `--peer` bundle): compiles rmm_peer.cpp as
#                                      `peer` does, then examples/peer latency-plan (ARGS, e.g.
#                                      --quick), rmm_peer --latency, examples/peer latency-run and
#                                      latency-report; last line
#                                      "peer-latency: N cells, M missed, F failed"
#        run.sh peer-frag [ARGS...]    the fragmentation scenarios (RMM issues 1957 and 496, the
#                                      multi-stream workload) with RMM C++ beside rmm-rs (a
#                                      `--peer` bundle): compiles rmm_peer.cpp as `peer` does,
#                                      then examples/peer frag-plan (ARGS, e.g. --quick),
#                                      rmm_peer --frag, examples/peer frag-run and frag-report;
#                                      last line "peer-frag: N rmm-rs rows, M RMM rows, F failed"
#        run.sh peer-replay [LOG...]   end to end (a `--peer` bundle): each LOG (RMM's CSV
#                                      format; default: peer/logs/*.csv, rmm-replay's sample,
#                                      and two synthetic logs of RMM_PEER_REPLAY_OPS operations)
#                                      rewritten onto one thread by examples/peer replay-prep,
#                                      then replayed through rmm-rs's pool (tools/rmm-replay
#                                      --resource pool) and RMM's (rmm_peer --replay, compiled
#                                      as `peer` does, or reused) in RMM_PEER_REPLAY_ROUNDS
#                                      fresh processes a side (default 5), ABBA order; reduced
#                                      by examples/peer report-replay to each side's median wall
#                                      time of the replay and rmm-rs / RMM; last line
#                                      "peer-replay: N logs, M above 0.30"
#        run.sh torch [ARGS...]        the C API and PyTorch (a bundle made with `cargo xtask gpu
#                                      bundle --torch`): capi/test_capi, capi/test_torch_shim,
#                                      then the wheel capi/rmm_rs_torch-*.whl installed into a
#                                      venv (--system-site-packages: python3's torch) and, with
#                                      its python, capi/python/tests/test_ctypes.py and
#                                      test_torch.py ARGS...; last line
#                                      "torch: N passed, M failed, K skipped"
#        run.sh torch-bench [ARGS...]  capi/python/bench_torch.py ARGS...: torch.empty+del per pair
#                                      and a training step, torch's allocator against rmm-rs
#        run.sh torch-alloc [ARGS...]  the allocator alone (a `--torch` bundle): compiles
#                                      capi/python/tools/torch_alloc.cpp with CXX against
#                                      python3's torch (headers, libc10, libc10_cuda), the CUDA
#                                      headers beside nvcc (or CUDA_HOME) and librmm_capi.so,
#                                      then times allocate+free pairs of 1 KiB, 256 KiB, 4 MiB
#                                      and 64 MiB through torch's caching allocator (C++ API)
#                                      and rmm-rs's torch hooks, in one process, ABBA (ARGS:
#                                      --pairs N, --rounds N, --statistics); last line
#                                      "torch-alloc: N sizes, M above 1.00"
#        run.sh example NAME [ARGS...] examples/NAME ARGS...
#        run.sh sanitize [TOOL...] [-- ARGS...]
#                                      the test binaries of RMM_SANITIZE_BINS under NVIDIA's
#                                      compute-sanitizer, once per TOOL (memcheck, with
#                                      --leak-check full; racecheck; synccheck; initcheck;
#                                      default: all four), each with --error-exitcode 1 and
#                                      --report-api-errors no, the
#                                      binaries getting --test-threads=1 ARGS...; one line per
#                                      tool "sanitize: TOOL: N binaries, E errors, ...", last
#                                      line "sanitize: T tools, E errors, F failed tests"
#        run.sh --self-test            checks this script on fake bundles
#        run.sh --help
#
# environment:
#   RMM_GPU_MODES       stream modes to test under (default "legacy per-thread"); each run
#                       exports RMM_DEFAULT_STREAM=<mode>
#   RMM_GPU_TIMEOUT     seconds one binary may run before it counts as crashed (default 300,
#                       0 for no limit)
#   OUT                 if set, the logs of this run are also written to $OUT/gpu-log.txt (all
#                       logs in one file, each cut in the middle if needed to stay under
#                       RMM_GPU_LOG_LIMIT bytes, default 15 MiB) and $OUT/gpu-summary.txt
#   RMM_GPU_NVIDIA_LIB  driver library folder put first on LD_LIBRARY_PATH when it exists
#                       (default /usr/local/nvidia/lib64)
#   RMM_BENCH_FILTER    `bench` runs only the bench binaries whose name matches this glob
#                       (e.g. '*--random_allocations'; default: all)
#   RMM_PEER_WRAP_ROUNDS  fresh processes a side for `peer`'s wrapper rounds (default 3; 0:
#                       none)
#   RMM_PEER_AB_ROUNDS  `peer-ab`'s processes a side when ROUNDS is not given (default 3)
#   RMM_PEER_REPLAY_ROUNDS  `peer-replay`'s processes a side and log (default 5)
#   RMM_PEER_REPLAY_OPS operations of each synthetic log of `peer-replay` without LOGs
#                       (default 200000)
#   NVCC                the compiler `peer` uses (default: nvcc on PATH, else
#                       /usr/local/cuda/bin/nvcc or /usr/local/cuda-*/bin/nvcc)
#   COMPUTE_SANITIZER   the compute-sanitizer `sanitize` uses (default: on PATH, else
#                       /usr/local/cuda/bin or /usr/local/cuda-*/bin)
#   RMM_SANITIZE_BINS   the bin/ names (globs) `sanitize` runs (default "rmm-mr--gpu_stress
#                       rmm-mr--gpu_conformance rmm-containers--gpu_containers"; '*' for all)
#   RMM_SANITIZE_MODES  the stream modes `sanitize` runs each binary in (default "legacy")
#   RMM_SANITIZE_TIMEOUT  seconds one binary may run under a tool (default 150; 0: no limit)
#   RMM_SANITIZE_SPLIT  the tools under which each binary runs once per test group (the name up
#                       to its second '::', or its last '/'), one process each, when no ARGS
#                       are given (default "initcheck": its device memory grows through a
#                       process and fills an 80 GB GPU within one run of the conformance suite)
#   RMM_STRESS_OPS      operations per thread of the stress trials; `sanitize` sets 40
#                       unless it is set
#   PYTHON              the Python `torch`, `torch-bench` and `torch-alloc` use (default
#                       python3)
#   CXX, CUDA_HOME      `torch-alloc`'s C++ compiler (default g++, else c++) and CUDA
#                       toolkit (default: nvcc's, as NVCC above)
#
# Logs stay in logs/ beside this script: <mode>--<binary>.log, bench--<name>.log,
# example--<name>.log, peer-*.log (peer-frag-*.log, peer-wrap-*.log), sanitize-<tool>--<mode>--<binary>.log,
# torch--<program>.log, torch-bench.log, torch-alloc.log (torch-alloc-compile.log), summary.txt.

set -uo pipefail
shopt -s extglob

BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$BUNDLE/$(basename "${BASH_SOURCE[0]}")"
LOGS="$BUNDLE/logs"
TIMEOUT=${RMM_GPU_TIMEOUT:-300}
RUN_LOGS=() # the logs this invocation wrote, in order
RC=0        # exit status of the last run_captured

usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "$SELF"
}

# Puts the driver's libraries first on LD_LIBRARY_PATH, makes logs/ and restores the
# executables' mode bits in case a copy lost them.
setup_env() {
  local lib=${RMM_GPU_NVIDIA_LIB:-/usr/local/nvidia/lib64}
  if [[ -d $lib ]]; then
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  mkdir -p "$LOGS"
  local f
  for f in "$BUNDLE"/bin/* "$BUNDLE"/bench/* "$BUNDLE"/examples/*; do
    [[ -f $f && ! -x $f ]] && chmod +x "$f" 2>/dev/null
  done
  return 0
}

# run_captured LOG CMD...: runs CMD in the bundle folder under the time limit, echoing its
# output and writing it to LOG; sets RC to its exit status.
run_captured() {
  local log=$1
  shift
  local -a limit=()
  if [[ $TIMEOUT != 0 ]] && command -v timeout >/dev/null 2>&1; then
    limit=(timeout -k 10 "$TIMEOUT")
  fi
  (cd "$BUNDLE" && exec "${limit[@]}" "$@") 2>&1 | tee "$log"
  RC=${PIPESTATUS[0]}
  RUN_LOGS+=("$log")
}

# describe_exit STATUS: how a process with that exit status ended, in words.
describe_exit() {
  local rc=$1
  if [[ $rc == 124 && $TIMEOUT != 0 ]]; then
    echo "timed out after ${TIMEOUT}s"
  elif ((rc > 128)); then
    echo "killed by SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"
  else
    echo "exit status $rc"
  fi
}

# parse_result LOG: sets R_FOUND (0 or 1), R_PASSED, R_FAILED, R_IGNORED from the last
# "test result: ok|FAILED. N passed; M failed; K ignored; ..." line (libtest and libtest-mimic).
parse_result() {
  R_FOUND=0 R_PASSED=0 R_FAILED=0 R_IGNORED=0
  local line esc=$'\e' cr=$'\r'
  local re='test result: (ok|FAILED)\. ([0-9]+) passed; ([0-9]+) failed; ([0-9]+) ignored'
  while IFS= read -r line || [[ -n $line ]]; do
    [[ $line == *"test result:"* ]] || continue
    line=${line//"$esc"\[*([0-9;])m/}
    line=${line//"$cr"/}
    if [[ $line =~ $re ]]; then
      R_FOUND=1
      R_PASSED=$((10#${BASH_REMATCH[2]}))
      R_FAILED=$((10#${BASH_REMATCH[3]}))
      R_IGNORED=$((10#${BASH_REMATCH[4]}))
    fi
  done <"$1"
}

# export_out REPORT_FILE: with OUT set, writes $OUT/gpu-log.txt (every log of this run, then the
# report) within RMM_GPU_LOG_LIMIT bytes of log text, and $OUT/gpu-summary.txt (the report).
export_out() {
  [[ -n ${OUT:-} ]] || return 0
  local report=$1 limit=${RMM_GPU_LOG_LIMIT:-$((15 * 1024 * 1024))}
  if ! mkdir -p "$OUT"; then
    echo "run.sh: cannot create OUT=$OUT; logs stay in $LOGS" >&2
    return 0
  fi
  local n=${#RUN_LOGS[@]} i size idx remaining=$limit left
  local -a sizes=() budgets=()
  for ((i = 0; i < n; i++)); do
    sizes[i]=$(wc -c <"${RUN_LOGS[i]}")
  done
  # Share the budget out smallest log first: small logs stay whole, big ones get what is left.
  left=$n
  while read -r size idx; do
    [[ -n ${idx:-} ]] || continue
    local share=$((remaining / left))
    budgets[idx]=$((size < share ? size : share))
    remaining=$((remaining - budgets[idx]))
    left=$((left - 1))
  done < <(for ((i = 0; i < n; i++)); do echo "${sizes[i]} $i"; done | sort -n)
  {
    for ((i = 0; i < n; i++)); do
      local log=${RUN_LOGS[i]} budget=${budgets[i]:-0}
      printf '===== %s (%d bytes) =====\n' "${log##*/}" "${sizes[i]}"
      if ((sizes[i] <= budget)); then
        cat "$log"
      else
        local head=$((budget / 2))
        head -c "$head" "$log"
        printf '\n[... run.sh cut %d bytes from the middle of this log; all of it is in logs/%s ...]\n' \
          $((sizes[i] - budget)) "${log##*/}"
        tail -c $((budget - head)) "$log"
      fi
      printf '\n'
    done
    printf '===== summary =====\n'
    cat "$report"
  } >"$OUT/gpu-log.txt"
  cp "$report" "$OUT/gpu-summary.txt"
}

# run_tests [FILTER...]: every bin/* binary under every mode; prints the table and summary.
run_tests() {
  local -a modes bins
  read -r -a modes <<<"${RMM_GPU_MODES:-legacy per-thread}"
  local mode
  for mode in "${modes[@]}"; do
    if [[ $mode != legacy && $mode != per-thread ]]; then
      echo "run.sh: unknown stream mode '$mode' in RMM_GPU_MODES (use legacy and/or per-thread)" >&2
      return 2
    fi
  done
  if ((${#modes[@]} == 0)); then
    echo "run.sh: RMM_GPU_MODES names no mode" >&2
    return 2
  fi
  shopt -s nullglob
  bins=("$BUNDLE"/bin/*)
  shopt -u nullglob
  if ((${#bins[@]} == 0)); then
    echo "run.sh: no test binaries in $BUNDLE/bin; build the bundle with cargo xtask gpu bundle" >&2
    return 1
  fi

  local passed=0 failed=0 skipped=0 bin name log status
  local -a rows=() crashed=()
  for mode in "${modes[@]}"; do
    for bin in "${bins[@]}"; do
      name=${bin##*/}
      log="$LOGS/$mode--$name.log"
      echo "=== [$mode] $name"
      run_captured "$log" env RMM_DEFAULT_STREAM="$mode" "$bin" --test-threads=1 "$@"
      parse_result "$log"
      if ((R_FOUND)) && ((RC == 0 || R_FAILED > 0)); then
        ((R_FAILED > 0)) && status=FAILED || status=ok
      else
        if ((R_FOUND)); then
          status="CRASHED after its result line: $(describe_exit "$RC")"
        elif ((RC != 0)); then
          status="CRASHED: $(describe_exit "$RC"), no test result line"
        else
          status="FAILED: exit status 0 but no test result line"
        fi
        R_FAILED=$((R_FAILED + 1))
        crashed+=("$mode/$name ($status)")
      fi
      passed=$((passed + R_PASSED))
      failed=$((failed + R_FAILED))
      skipped=$((skipped + R_IGNORED))
      rows+=("$(printf '%-10s %-44s %5d passed %5d failed %5d skipped  %s' \
        "$mode" "$name" "$R_PASSED" "$R_FAILED" "$R_IGNORED" "$status")")
    done
  done

  local report="$LOGS/summary.txt"
  {
    echo "--- per binary and mode ---"
    printf '%s\n' "${rows[@]}"
    if ((${#crashed[@]})); then
      echo "--- did not finish normally ---"
      printf '%s\n' "${crashed[@]}"
    fi
    printf 'gpu: %d passed, %d failed, %d skipped\n' "$passed" "$failed" "$skipped"
  } >"$report"
  export_out "$report"
  echo
  cat "$report"
  ((failed == 0 && ${#crashed[@]} == 0))
}

# run_benches [ARGS...]: every bench/* binary once, with --bench ARGS, default stream legacy.
run_benches() {
  local -a bins
  shopt -s nullglob
  bins=("$BUNDLE"/bench/*)
  shopt -u nullglob
  local report="$LOGS/summary.txt" failed=0 bin name
  local -a rows=()
  if [[ -n ${RMM_BENCH_FILTER:-} ]]; then
    local -a kept=()
    for bin in "${bins[@]}"; do
      # shellcheck disable=SC2053 # a glob on purpose
      [[ ${bin##*/} == $RMM_BENCH_FILTER ]] && kept+=("$bin")
    done
    bins=("${kept[@]}")
  fi
  for bin in "${bins[@]}"; do
    name=${bin##*/}
    echo "=== [bench] $name"
    run_captured "$LOGS/bench--$name.log" env RMM_DEFAULT_STREAM=legacy "$bin" --bench "$@"
    if ((RC == 0)); then
      rows+=("bench $name: ok")
    else
      failed=$((failed + 1))
      rows+=("bench $name: FAILED ($(describe_exit "$RC"))")
    fi
  done
  {
    ((${#bins[@]})) || echo "no bench binaries in bench/"
    ((${#rows[@]})) && printf '%s\n' "${rows[@]}"
    printf 'bench: %d ran, %d failed\n' "${#bins[@]}" "$failed"
  } >"$report"
  export_out "$report"
  echo
  cat "$report"
  ((failed == 0))
}

# unpack WHEEL DIR: extracts a wheel (a zip) into DIR with python3 or unzip.
unpack() {
  mkdir -p "$2"
  if command -v python3 >/dev/null 2>&1; then
    python3 -m zipfile -e "$1" "$2"
  elif command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$1" -d "$2"
  else
    echo "run.sh: peer: cannot unpack $1: neither python3 nor unzip is installed" >&2
    return 1
  fi
}

# find_nvcc: prints the CUDA compiler to use.
find_nvcc() {
  if [[ -n ${NVCC:-} ]]; then
    echo "$NVCC"
  elif command -v nvcc >/dev/null 2>&1; then
    command -v nvcc
  else
    local c
    for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
      if [[ -x $c ]]; then
        echo "$c"
        return 0
      fi
    done
    return 1
  fi
}

# peer_build LAST_LINE [reuse]: checks that the bundle has the peer side, unpacks the wheels and
# compiles the RMM C++ driver into peer/build/rmm_peer; sets PEER_LIBS (the wheels' library
# folders). With `reuse`, keeps peer/build as it is when its rmm_peer is newer than
# rmm_peer.cpp and the wheels (an earlier `peer` compiled it). On a compile error, writes the
# summary ending with "LAST_LINE (compile error)". Returns 2 when the bundle has no peer side,
# 1 on another failure.
peer_build() {
  local last_line=$1 reuse=${2:-}
  local dir="$BUNDLE/peer" build="$BUNDLE/peer/build" peer="$BUNDLE/examples/peer"
  local report="$LOGS/summary.txt"
  if [[ ! -f $dir/rmm_peer.cpp ]]; then
    echo "run.sh: this bundle has no peer/rmm_peer.cpp; build it with: cargo xtask gpu bundle --peer" >&2
    return 2
  fi
  if [[ ! -f $peer ]]; then
    echo "run.sh: this bundle has no examples/peer (the rmm-rs side); rebuild it with: cargo xtask gpu bundle --peer" >&2
    return 2
  fi
  local -a rmm_whl log_whl
  shopt -s nullglob
  rmm_whl=("$dir"/wheels/librmm_cu13-*.whl)
  log_whl=("$dir"/wheels/rapids_logger-*.whl)
  shopt -u nullglob
  if ((${#rmm_whl[@]} != 1 || ${#log_whl[@]} != 1)); then
    echo "run.sh: peer/wheels/ must hold one librmm_cu13-*.whl and one rapids_logger-*.whl (found ${#rmm_whl[@]} and ${#log_whl[@]})" >&2
    return 2
  fi
  local rmm_root="$build/librmm/librmm" log_root="$build/rapids_logger/rapids_logger" f
  if [[ $reuse == reuse && -x $build/rmm_peer && $build/rmm_peer -nt $dir/rmm_peer.cpp &&
    $build/rmm_peer -nt ${rmm_whl[0]} && $build/rmm_peer -nt ${log_whl[0]} &&
    -f $rmm_root/lib64/librmm.so && -f $log_root/lib64/librapids_logger.so ]]; then
    echo "=== [peer] reusing peer/build/rmm_peer (newer than rmm_peer.cpp and the wheels)"
    PEER_LIBS="$rmm_root/lib64:$log_root/lib64"
    return 0
  fi
  rm -rf "$build"
  mkdir -p "$build"
  echo "=== [peer] unpacking ${rmm_whl[0]##*/} and ${log_whl[0]##*/}"
  unpack "${rmm_whl[0]}" "$build/librmm" || return 1
  unpack "${log_whl[0]}" "$build/rapids_logger" || return 1
  for f in "$rmm_root/include/rmm" "$rmm_root/include/rapids/cuda" "$rmm_root/lib64/librmm.so" \
    "$log_root/include" "$log_root/lib64/librapids_logger.so"; do
    if [[ ! -e $f ]]; then
      echo "run.sh: peer: the wheels do not hold ${f#"$build"/} (unexpected wheel layout)" >&2
      return 1
    fi
  done
  local nvcc
  if ! nvcc=$(find_nvcc); then
    echo "run.sh: peer: no CUDA compiler: set NVCC, put nvcc on PATH or install it in /usr/local/cuda" >&2
    return 1
  fi
  local libs="$rmm_root/lib64:$log_root/lib64"
  # The wheel's CCCL headers (include/rapids) must come before the toolkit's; librmm and
  # rapids-logger are found at run time through the rpath (and LD_LIBRARY_PATH below).
  local -a compile=("$nvcc" -std=c++20 -O2
    -DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR
    -DTHRUST_DISABLE_ABI_NAMESPACE -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR -DCCCL_DISABLE_PDL
    -I"$rmm_root/include/rapids" -I"$rmm_root/include" -I"$log_root/include"
    "$dir/rmm_peer.cpp" -o "$build/rmm_peer"
    -L"$rmm_root/lib64" -L"$log_root/lib64" -Xlinker --no-as-needed -lrmm -lrapids_logger
    -ldl -lpthread -Xlinker --disable-new-dtags -Xlinker -rpath -Xlinker "$libs")
  echo "=== [peer] compiling rmm_peer.cpp: ${compile[*]}"
  local clog="$LOGS/peer-compile.log" start=$SECONDS
  if ! (cd "$build" && "${compile[@]}") >"$clog" 2>&1 || [[ ! -x $build/rmm_peer ]]; then
    RUN_LOGS+=("$clog")
    {
      echo "peer: compiling rmm_peer.cpp failed; the command:"
      echo "  ${compile[*]}"
      echo "the compiler's output (last 150 lines; all of it in logs/peer-compile.log):"
      tail -n 150 "$clog"
      echo "$last_line (compile error)"
    } >"$report"
    export_out "$report"
    cat "$report"
    return 1
  fi
  RUN_LOGS+=("$clog")
  echo "compiled in $((SECONDS - start)) s"
  PEER_LIBS=$libs
}

# peer_plan TAG SUBCOMMAND PLAN FAILED_LINE [ARGS...]: examples/peer SUBCOMMAND PLAN ARGS (the
# rmm-rs side writes the plan both sides replay), its exit appended to the caller's `steps`;
# when it fails, writes and shows the summary (`steps`, then FAILED_LINE) and returns 1.
peer_plan() {
  local tag=$1 sub=$2 plan=$3 failed_line=$4
  shift 4
  echo "=== [$tag] plan"
  run_captured "$LOGS/$tag-plan.log" env RMM_DEFAULT_STREAM=legacy "$BUNDLE/examples/peer" "$sub" "$plan" "$@"
  steps+=("peer $sub: $(describe_exit "$RC")")
  if ((RC != 0)); then
    printf '%s\n' "${steps[@]}" "$failed_line (no plan)" >"$LOGS/summary.txt"
    export_out "$LOGS/summary.txt"
    cat "$LOGS/summary.txt"
    return 1
  fi
}

# peer_summary LOG LAST_RE FAILED_LINE RC: writes the summary of a comparison: the caller's
# `steps`, the report LOG without its lines matching LAST_RE, then the last of those (else
# FAILED_LINE with how the report ended, RC).
peer_summary() {
  local log=$1 last_re=$2 failed_line=$3 rc=$4 last
  {
    printf '%s\n' "${steps[@]}"
    echo
    grep -v "$last_re" "$log"
    last=$(grep "$last_re" "$log" | tail -n 1)
    echo "${last:-$failed_line (no report: $(describe_exit "$rc"))}"
  } >"$LOGS/summary.txt"
}

# peer_steps TAG PREFIX FAILED_LINE LAST_RE [ARGS...]: after peer_build, the four steps of
# a comparison with RMM C++: examples/peer PREFIXplan (ARGS), rmm_peer (with
# --frag when PREFIX is `frag-`), examples/peer PREFIXrun (rmm-rs) and PREFIXreport. Logs are
# logs/TAG-*.log, files peer/build/PREFIX*, OUT gets TAG-rmm-rs.tsv and TAG-rmm.tsv; the last
# line of the summary is the report's last line matching LAST_RE, else FAILED_LINE with why.
peer_steps() {
  local tag=$1 prefix=$2 failed_line=$3 last_re=$4
  shift 4
  local build="$BUNDLE/peer/build" peer="$BUNDLE/examples/peer" libs=$PEER_LIBS
  local report="$LOGS/summary.txt"
  local plan="$build/${prefix}plan.txt" ours="$build/${prefix}rmm-rs.tsv"
  local theirs="$build/${prefix}rmm.tsv"
  local -a steps=()
  local flag=""
  if [[ $prefix == frag- ]]; then
    flag=--frag
  elif [[ $prefix == latency- ]]; then
    flag=--latency
  fi
  peer_plan "$tag" "${prefix}plan" "$plan" "$failed_line" "$@" || return 1
  echo "=== [$tag] RMM C++ (rmm_peer${flag:+ $flag})"
  run_captured "$LOGS/$tag-rmm.log" env LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$build/rmm_peer" ${flag:+"$flag"} "$plan" "$theirs"
  steps+=("rmm_peer${flag:+ $flag} (RMM): $(describe_exit "$RC")")
  echo "=== [$tag] rmm-rs (examples/peer ${prefix}run)"
  run_captured "$LOGS/$tag-rmm-rs.log" env RMM_DEFAULT_STREAM=legacy "$peer" "${prefix}run" "$plan" "$ours"
  steps+=("peer ${prefix}run (rmm-rs): $(describe_exit "$RC")")
  echo "=== [$tag] report"
  [[ -f $ours ]] || : >"$ours"
  [[ -f $theirs ]] || : >"$theirs"
  run_captured "$LOGS/$tag-report.log" "$peer" "${prefix}report" "$ours" "$theirs"
  local rc=$RC
  peer_summary "$LOGS/$tag-report.log" "$last_re" "$failed_line" "$rc"
  if [[ -n ${OUT:-} ]] && mkdir -p "$OUT"; then
    cp "$ours" "$OUT/$tag-rmm-rs.tsv" 2>/dev/null
    cp "$theirs" "$OUT/$tag-rmm.tsv" 2>/dev/null
  fi
  export_out "$report"
  echo
  cat "$report"
  [[ $(tail -n 1 "$report") == *" 0 failed" ]] && ((rc == 0))
}

# peer_rounds PLAN ROUNDS: after peer_build, the wrapper cells again, alone: PLAN's `async` and
# `cuda` resources (every other `resource` line dropped, the workloads kept) in
# peer/build/wrap-plan.txt, each side in ROUNDS fresh processes in ABBA order (RMM, rmm-rs,
# rmm-rs, RMM, RMM, rmm-rs, ...) so that neither side always runs first, then examples/peer
# report-rounds (per-cell medians over the processes). Each process's exit is appended to the
# caller's `steps`; logs are logs/peer-wrap-*.log, OUT gets peer-wrap-report.txt and every
# process's peer-wrap-<side>-<n>.tsv. Writes the summary (`steps`, the report, its last
# `peer-wrappers:` line or WRAP_FAILED with why) and returns 0 when report-rounds reduced
# every cell.
WRAP_FAILED="peer-wrappers: 0 cells, 0 above 1.00"
peer_rounds() {
  local all=$1 rounds=$2
  local build="$BUNDLE/peer/build" peer="$BUNDLE/examples/peer" libs=$PEER_LIBS
  local plan="$build/wrap-plan.txt"
  sed -E '/^resource /{/^resource (async|cuda)$/!d;}' "$all" >"$plan"
  if [[ $(grep -c -E '^resource ' "$plan") != 2 ]]; then
    echo "run.sh: the plan $all lacks \`resource async\` or \`resource cuda\`" >&2
    printf '%s\n' "${steps[@]}" "$WRAP_FAILED (no wrapper cells in the plan)" >"$LOGS/summary.txt"
    return 1
  fi
  local ours="" theirs="" i n side out
  local -a files=()
  for ((i = 0; i < 2 * rounds; i++)); do
    n=$((i / 2 + 1))
    # Pairs alternate which side goes first: (RMM, rmm-rs), (rmm-rs, RMM), ...
    if (((i / 2) % 2 == i % 2)); then side=rmm; else side=rmm-rs; fi
    out="$build/wrap-$side-$n.tsv"
    rm -f "$out"
    echo "=== [peer-wrap] process $((i + 1)) of $((2 * rounds)): $side"
    if [[ $side == rmm ]]; then
      run_captured "$LOGS/peer-wrap-rmm-$n.log" env LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$build/rmm_peer" "$plan" "$out"
      theirs+="${theirs:+,}$out"
    else
      run_captured "$LOGS/peer-wrap-rmm-rs-$n.log" env RMM_DEFAULT_STREAM=legacy "$peer" run "$plan" "$out"
      ours+="${ours:+,}$out"
    fi
    steps+=("wrapper cells, $side process $n: $(describe_exit "$RC")")
    [[ -f $out ]] || : >"$out"
    files+=("$out")
  done
  echo "=== [peer-wrap] report"
  run_captured "$LOGS/peer-wrap-report.log" "$peer" report-rounds "$ours" "$theirs"
  local rc=$RC
  peer_summary "$LOGS/peer-wrap-report.log" '^peer-wrappers: ' "$WRAP_FAILED" "$rc"
  if [[ -n ${OUT:-} ]] && mkdir -p "$OUT"; then
    cp "$LOGS/peer-wrap-report.log" "$OUT/peer-wrap-report.txt" 2>/dev/null
    for out in "${files[@]}"; do
      cp "$out" "$OUT/peer-${out##*/}" 2>/dev/null
    done
  fi
  return "$rc"
}

# wrap_rounds VALUE WHAT MIN: checks a number of processes a side (at least MIN); says why not.
wrap_rounds() {
  if [[ $1 =~ ^[0-9]+$ ]] && ((10#$1 >= $3)); then
    return 0
  fi
  echo "run.sh: $2 must be a whole number of processes a side, at least $3, not '$1'" >&2
  return 1
}

# run_peer [ARGS...]: compiles the RMM C++ driver against the bundled wheels, then plans,
# runs both sides and reports; ARGS go to `examples/peer plan`. Then, unless
# RMM_PEER_WRAP_ROUNDS is 0, the plan's wrapper cells again in fresh processes (peer_rounds,
# RMM_PEER_WRAP_ROUNDS a side, default 3); the summary ends with their `peer-wrappers:` line.
run_peer() {
  local failed_line="peer: 0 cells compared, 1 failed"
  local rounds=${RMM_PEER_WRAP_ROUNDS:-3}
  if ! wrap_rounds "$rounds" RMM_PEER_WRAP_ROUNDS 0; then
    echo "$failed_line (bad RMM_PEER_WRAP_ROUNDS)"
    return 1
  fi
  rounds=$((10#$rounds))
  peer_build "$failed_line" || return
  local ok=0
  peer_steps peer "" "$failed_line" '^peer: .* cells compared' "$@" || ok=1
  ((rounds > 0)) || return "$ok"
  if [[ $(tail -n 1 "$LOGS/summary.txt") == "$failed_line (no plan)" ]]; then
    return 1
  fi
  local main="$LOGS/peer-main-summary.txt" wrap="$LOGS/peer-wrap-summary.txt"
  cp "$LOGS/summary.txt" "$main"
  local -a steps=()
  echo
  echo "=== [peer-wrap] the wrapper cells again, alone: $rounds fresh processes a side, ABBA order"
  peer_rounds "$BUNDLE/peer/build/plan.txt" "$rounds" || ok=1
  cp "$LOGS/summary.txt" "$wrap"
  { cat "$main" && echo && cat "$wrap"; } >"$LOGS/summary.txt"
  export_out "$LOGS/summary.txt"
  echo
  cat "$wrap"
  return "$ok"
}

# run_peer_wrap [ROUNDS]: `run_peer`'s wrapper rounds alone (ROUNDS a side, default
# RMM_PEER_WRAP_ROUNDS or 3) on a fresh plan with no arguments: compiles the RMM C++ driver as
# `peer` does (or reuses the one an earlier `peer` compiled), plans, then peer_rounds.
run_peer_wrap() {
  local rounds=${1:-${RMM_PEER_WRAP_ROUNDS:-3}}
  if ! wrap_rounds "$rounds" ROUNDS 1; then
    echo "$WRAP_FAILED (bad ROUNDS)"
    return 1
  fi
  rounds=$((10#$rounds))
  peer_build "$WRAP_FAILED" reuse || return
  local all="$BUNDLE/peer/build/wrap-plan-all.txt" rc=0
  local -a steps=()
  peer_plan peer-wrap plan "$all" "$WRAP_FAILED" || return 1
  peer_rounds "$all" "$rounds" || rc=1
  export_out "$LOGS/summary.txt"
  echo
  cat "$LOGS/summary.txt"
  return "$rc"
}

# run_peer_ab BEFORE [ROUNDS] [ARGS...]: the sub-allocator cells of one plan, measured by two
# builds of rmm-rs: BEFORE (an older examples/peer) and this bundle's examples/peer (after),
# each in ROUNDS (default RMM_PEER_AB_ROUNDS or 3) fresh processes in ABBA order (before,
# after, after, before, before, after, ...), then examples/peer report-ab (per cell the medians
# of both sides, after / before, each side's peak reserved memory). Needs no peer/ folder: no
# RMM C++, wheels or nvcc. Files in peer-ab/, logs logs/peer-ab-*.log; OUT gets
# peer-ab-report.txt and every process's peer-ab-<side>-<n>.tsv. Last line "peer-ab: N cells,
# M above 1.10"; exit status 0 when report-ab reduced every cell.
AB_FAILED="peer-ab: 0 cells, 0 above 1.10"
run_peer_ab() {
  local before=${1:-}
  if [[ -z $before || $before == -* ]]; then
    echo "run.sh: usage: run.sh peer-ab BEFORE_PEER_BINARY [ROUNDS] [ARGS...]" >&2
    echo "$AB_FAILED (no before binary)"
    return 2
  fi
  shift
  local rounds=${RMM_PEER_AB_ROUNDS:-3}
  if (($#)) && [[ $1 != -* ]]; then
    rounds=$1
    shift
  fi
  if ! wrap_rounds "$rounds" ROUNDS 1; then
    echo "$AB_FAILED (bad ROUNDS)"
    return 1
  fi
  rounds=$((10#$rounds))
  # The processes run in the bundle folder: a relative path is the caller's.
  [[ $before == /* ]] || before="$PWD/$before"
  if [[ ! -f $before || ! -x $before ]]; then
    echo "run.sh: peer-ab: the before binary $before is not an executable file" >&2
    echo "$AB_FAILED (no before binary)"
    return 2
  fi
  local peer="$BUNDLE/examples/peer" dir="$BUNDLE/peer-ab"
  if [[ ! -f $peer ]]; then
    echo "run.sh: this bundle has no examples/peer (the after side); build it with: cargo xtask gpu bundle" >&2
    echo "$AB_FAILED (no examples/peer)"
    return 2
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  local all="$dir/plan-all.txt" plan="$dir/plan.txt"
  local -a steps=() files=()
  peer_plan peer-ab plan "$all" "$AB_FAILED" "$@" || return 1
  sed -E '/^resource /{/^resource (pool|arena|binning|fixed_size)( |$)/!d;}' "$all" >"$plan"
  if ! grep -q -E '^resource ' "$plan"; then
    printf '%s\n' "${steps[@]}" "$AB_FAILED (no sub-allocator cells in the plan)" >"$LOGS/summary.txt"
    export_out "$LOGS/summary.txt"
    cat "$LOGS/summary.txt"
    return 1
  fi
  local befores="" afters="" i n side exe out
  for ((i = 0; i < 2 * rounds; i++)); do
    n=$((i / 2 + 1))
    # Pairs alternate which side goes first: (before, after), (after, before), ...
    if (((i / 2) % 2 == i % 2)); then side=before exe=$before; else side=after exe=$peer; fi
    out="$dir/$side-$n.tsv"
    rm -f "$out"
    echo "=== [peer-ab] process $((i + 1)) of $((2 * rounds)): $side"
    run_captured "$LOGS/peer-ab-$side-$n.log" env RMM_DEFAULT_STREAM=legacy "$exe" run "$plan" "$out"
    steps+=("sub-allocator cells, $side process $n: $(describe_exit "$RC")")
    [[ -f $out ]] || : >"$out"
    files+=("$out")
    if [[ $side == before ]]; then befores+="${befores:+,}$out"; else afters+="${afters:+,}$out"; fi
  done
  echo "=== [peer-ab] report"
  run_captured "$LOGS/peer-ab-report.log" "$peer" report-ab "$befores" "$afters"
  local rc=$RC
  peer_summary "$LOGS/peer-ab-report.log" '^peer-ab: .* cells, ' "$AB_FAILED" "$rc"
  if [[ -n ${OUT:-} ]] && mkdir -p "$OUT"; then
    cp "$LOGS/peer-ab-report.log" "$OUT/peer-ab-report.txt" 2>/dev/null
    for out in "${files[@]}"; do
      cp "$out" "$OUT/peer-ab-${out##*/}" 2>/dev/null
    done
  fi
  export_out "$LOGS/summary.txt"
  echo
  cat "$LOGS/summary.txt"
  return "$rc"
}

# run_peer_frag [ARGS...]: compiles the RMM C++ driver as `peer` does, then the fragmentation
# scenarios on both sides: examples/peer frag-plan (ARGS, e.g. --quick), rmm_peer --frag (RMM
# C++), examples/peer frag-run (rmm-rs) and examples/peer frag-report (one table per scenario,
# RMM's rows beside rmm-rs's).
# run_peer_latency [ARGS...]: the sub-allocator cells' per-call latencies on both sides
# (rmm_peer --latency, examples/peer latency-run, latency-report).
run_peer_latency() {
  local failed_line="peer-latency: 0 cells, 0 missed, 1 failed"
  peer_build "$failed_line" || return
  peer_steps peer-latency latency- "$failed_line" '^peer-latency: .* cells, ' "$@"
}

run_peer_frag() {
  local failed_line="peer-frag: 0 rmm-rs rows, 0 RMM rows, 1 failed"
  peer_build "$failed_line" || return
  peer_steps peer-frag frag- "$failed_line" '^peer-frag: .* rows, ' "$@"
}

# run_peer_replay [LOG...]: end to end, each LOG (RMM-format CSV; default: the bundle's
# peer/logs/*.csv and two synthetic logs of RMM_PEER_REPLAY_OPS operations, default 200000)
# replayed through rmm-rs's pool (tools/rmm-replay --resource pool) and RMM's
# (rmm_peer --replay, compiled as `peer` does or reused), on one thread: examples/peer
# replay-prep writes each log with every row on thread 1 into peer/build/replay/. Each side
# runs RMM_PEER_REPLAY_ROUNDS (default 5) fresh processes a log in ABBA order (RMM, rmm-rs,
# rmm-rs, RMM, ...), reduced by examples/peer report-replay. Logs are
# logs/peer-replay-<log>-<side>-<n>.log; OUT gets peer-replay-report.txt. Last line
# "peer-replay: N logs, M above 0.30"; exit status 0 when every process gave its figure.
REPLAY_FAILED="peer-replay: 0 logs, 0 above 0.30"
run_peer_replay() {
  local rounds=${RMM_PEER_REPLAY_ROUNDS:-5}
  if ! wrap_rounds "$rounds" RMM_PEER_REPLAY_ROUNDS 1; then
    echo "$REPLAY_FAILED (bad RMM_PEER_REPLAY_ROUNDS)"
    return 1
  fi
  rounds=$((10#$rounds))
  local tool="$BUNDLE/tools/rmm-replay"
  if [[ ! -f $tool ]]; then
    echo "run.sh: this bundle has no tools/rmm-replay; build it with: cargo xtask gpu bundle --peer" >&2
    echo "$REPLAY_FAILED (no rmm-replay)"
    return 2
  fi
  [[ -x $tool ]] || chmod +x "$tool" 2>/dev/null
  peer_build "$REPLAY_FAILED" reuse || return
  local build="$BUNDLE/peer/build" peer="$BUNDLE/examples/peer" libs=$PEER_LIBS
  local dir="$BUNDLE/peer/build/replay" report="$LOGS/summary.txt"
  local -a logs=("$@") prep=() prepared=() steps=() triples=()
  local i
  # The processes run in the bundle folder: a relative path is the caller's.
  for i in "${!logs[@]}"; do
    [[ ${logs[i]} == /* ]] || logs[i]="$PWD/${logs[i]}"
  done
  if ((${#logs[@]} == 0)); then
    shopt -s nullglob
    logs=("$BUNDLE"/peer/logs/*.csv)
    shopt -u nullglob
    prep=(--synthetic "${RMM_PEER_REPLAY_OPS:-200000}")
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "=== [peer-replay] the logs, every row on thread 1, in peer/build/replay/"
  run_captured "$LOGS/peer-replay-prep.log" "$peer" replay-prep "$dir" "${prep[@]}" "${logs[@]}"
  steps+=("peer replay-prep: $(describe_exit "$RC")")
  mapfile -t prepared < <(grep -E '\.csv$' "$LOGS/peer-replay-prep.log")
  if ((RC != 0 || ${#prepared[@]} == 0)); then
    printf '%s\n' "${steps[@]}" "$REPLAY_FAILED (no logs)" >"$report"
    export_out "$report"
    cat "$report"
    return 1
  fi
  local log name side n out ours theirs
  for log in "${prepared[@]}"; do
    name=${log##*/}
    ours="" theirs=""
    for ((i = 0; i < 2 * rounds; i++)); do
      n=$((i / 2 + 1))
      # Pairs alternate which side goes first: (RMM, rmm-rs), (rmm-rs, RMM), ...
      if (((i / 2) % 2 == i % 2)); then side=rmm; else side=rmm-rs; fi
      out="$LOGS/peer-replay-${name%.csv}-$side-$n.log"
      echo "=== [peer-replay] $name: process $((i + 1)) of $((2 * rounds)): $side"
      if [[ $side == rmm ]]; then
        run_captured "$out" env LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
          "$build/rmm_peer" --replay "$log"
        theirs+="${theirs:+,}$out"
      else
        run_captured "$out" env RMM_DEFAULT_STREAM=legacy "$tool" --resource pool "$log"
        ours+="${ours:+,}$out"
      fi
      steps+=("$name, $side process $n: $(describe_exit "$RC")")
    done
    triples+=("$name" "$ours" "$theirs")
  done
  echo "=== [peer-replay] report"
  run_captured "$LOGS/peer-replay-report.log" "$peer" report-replay "${triples[@]}"
  local rc=$RC
  peer_summary "$LOGS/peer-replay-report.log" '^peer-replay: .* logs, ' "$REPLAY_FAILED" "$rc"
  if [[ -n ${OUT:-} ]] && mkdir -p "$OUT"; then
    cp "$LOGS/peer-replay-report.log" "$OUT/peer-replay-report.txt" 2>/dev/null
  fi
  export_out "$report"
  echo
  cat "$report"
  return "$rc"
}

# parse_plain LOG LABEL: sets P_FOUND, P_PASSED, P_FAILED, P_SKIPPED from the last
# "LABEL: N passed, M failed[, K skipped]" line of LOG.
parse_plain() {
  P_FOUND=0 P_PASSED=0 P_FAILED=0 P_SKIPPED=0
  local line re="^$2: ([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?\$" cr=$'\r'
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line//"$cr"/}
    if [[ $line =~ $re ]]; then
      P_FOUND=1
      P_PASSED=$((10#${BASH_REMATCH[1]}))
      P_FAILED=$((10#${BASH_REMATCH[2]}))
      P_SKIPPED=$((10#${BASH_REMATCH[4]:-0}))
    fi
  done <"$1"
}

# torch_ready: the bundle has capi/ (made by cargo xtask gpu bundle); exports what the programs
# read: the library, the replay tool, unbuffered Python.
torch_ready() {
  if [[ ! -f $BUNDLE/capi/librmm_capi.so ]]; then
    echo "run.sh: this bundle has no capi/librmm_capi.so; build one with: cargo xtask gpu bundle --torch" >&2
    return 2
  fi
  export RMM_RS_LIBRARY="$BUNDLE/capi/librmm_capi.so"
  export RMM_REPLAY="$BUNDLE/tools/rmm-replay"
  export PYTHONUNBUFFERED=1
}

# run_torch [ARGS...]: the C and C++ programs, then the Python tests (ARGS go to test_torch.py),
# each adding its "LABEL: N passed, M failed, K skipped" line to the totals.
run_torch() {
  torch_ready || return $?
  local dir="$BUNDLE/capi" py=${PYTHON:-python3} scratch="$LOGS/torch-scratch"
  local report="$LOGS/summary.txt" passed=0 failed=0 skipped=0 label status
  local -a rows=()
  mkdir -p "$scratch"
  # The Python tests run as a user runs them: the wheel installed into a fresh virtual
  # environment that sees the system's torch, the library found by the module (not
  # RMM_RS_LIBRARY).
  local venv="$scratch/venv"
  local -a labels=(test_capi test_torch_shim wheel test_ctypes test_torch)
  for label in "${labels[@]}"; do
    local -a cmd
    case $label in
    test_capi) cmd=("$dir/test_capi" "$scratch") ;;
    test_torch_shim) cmd=("$dir/test_torch_shim") ;;
    wheel) cmd=(bash -c '
      py=$1 dir=$2 venv=$3
      rm -rf "$venv"
      # The venv sees the system site-packages; where python3 finds torch elsewhere (a
      # PYTHONPATH folder, a user site), a .pth file makes that folder visible too.
      torch_dir=$("$py" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" 2>/dev/null)
      if "$py" -m venv --system-site-packages "$venv" &&
        { [ ! -d "$torch_dir" ] || echo "$torch_dir" >"$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])")/system-torch.pth" || true; } &&
        "$venv/bin/pip" install --no-index "$dir"/rmm_rs_torch-*.whl &&
        env -u RMM_RS_LIBRARY "$venv/bin/python" -c "import rmm_rs_torch; print(\"enable():\", rmm_rs_torch.enable(), \"module:\", rmm_rs_torch.__file__)"; then
        echo "wheel: 1 passed, 0 failed, 0 skipped"
      else
        echo "wheel: 0 passed, 1 failed, 0 skipped"
        exit 1
      fi' wheel "$py" "$dir" "$venv") ;;
    test_ctypes) cmd=(env -u RMM_RS_LIBRARY "$venv/bin/python"
      "$dir/python/tests/test_ctypes.py") ;;
    test_torch) cmd=(env -u RMM_RS_LIBRARY "$venv/bin/python"
      "$dir/python/tests/test_torch.py" --replay "$RMM_REPLAY" "$@") ;;
    esac
    echo "=== [torch] $label"
    run_captured "$LOGS/torch--$label.log" env RMM_DEFAULT_STREAM=legacy "${cmd[@]}"
    parse_plain "$LOGS/torch--$label.log" "$label"
    if ((P_FOUND)) && ((RC == 0 || P_FAILED > 0)); then
      ((P_FAILED > 0)) && status=FAILED || status=ok
    else
      status="CRASHED: $(describe_exit "$RC")$( ((P_FOUND)) || echo ', no result line')"
      P_FAILED=$((P_FAILED + 1))
    fi
    passed=$((passed + P_PASSED))
    failed=$((failed + P_FAILED))
    skipped=$((skipped + P_SKIPPED))
    rows+=("$(printf '%-18s %5d passed %5d failed %5d skipped  %s' \
      "$label" "$P_PASSED" "$P_FAILED" "$P_SKIPPED" "$status")")
  done
  {
    echo "--- per program ---"
    printf '%s\n' "${rows[@]}"
    grep -h 'over-maximum exception:' "$LOGS/torch--test_torch.log" 2>/dev/null
    printf 'torch: %d passed, %d failed, %d skipped\n' "$passed" "$failed" "$skipped"
  } >"$report"
  export_out "$report"
  echo
  cat "$report"
  ((failed == 0))
}

# run_torch_bench [ARGS...]: bench_torch.py ARGS; the report is its table.
run_torch_bench() {
  torch_ready || return $?
  local report="$LOGS/summary.txt" py=${PYTHON:-python3}
  echo "=== [torch-bench] bench_torch.py"
  run_captured "$LOGS/torch-bench.log" env RMM_DEFAULT_STREAM=legacy \
    "$py" "$BUNDLE/capi/python/bench_torch.py" --library "$RMM_RS_LIBRARY" "$@"
  local rc=$RC
  {
    sed -n '/^torch .* on /,$p' "$LOGS/torch-bench.log"
    echo "torch-bench: $(describe_exit "$rc")"
  } >"$report"
  export_out "$report"
  echo
  cat "$report"
  return "$rc"
}

# run_torch_alloc [ARGS...]: the allocator alone, without Python (a bundle made with `cargo
# xtask gpu bundle --torch`): compiles capi/python/tools/torch_alloc.cpp with CXX (default
# g++, else c++) against python's torch (its include/ and lib/: libc10, libc10_cuda; the C++
# ABI torch.compiled_with_cxx11_abi() says), the CUDA headers beside nvcc (or CUDA_HOME) and
# capi/librmm_capi.so, then runs it with ARGS (--pairs N, --rounds N, --statistics): ns per
# allocate+free pair through torch's caching allocator and rmm-rs's torch hooks, ABBA, in one
# process. Last line "torch-alloc: N sizes, M above 1.00".
TORCH_ALLOC_FAILED="torch-alloc: 0 sizes, 0 above 1.00"
run_torch_alloc() {
  torch_ready || return $?
  local dir="$BUNDLE/capi" py=${PYTHON:-python3} report="$LOGS/summary.txt"
  local src="$BUNDLE/capi/python/tools/torch_alloc.cpp" build="$BUNDLE/capi/build"
  local fail_line="$TORCH_ALLOC_FAILED (compile error)"
  local -a found=()
  mapfile -t found < <("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch.compiled_with_cxx11_abi()))' 2>&1)
  local torch_dir=${found[0]:-} abi=${found[1]:-}
  if [[ ! -d $torch_dir/include || ! $abi =~ ^[01]$ ]]; then
    {
      echo "torch-alloc: $py cannot say where torch is: ${found[*]}"
      echo "$TORCH_ALLOC_FAILED (no torch)"
    } >"$report"
    export_out "$report"
    cat "$report"
    return 1
  fi
  local cuda_home=${CUDA_HOME:-} nvcc
  if [[ -z $cuda_home ]] && nvcc=$(find_nvcc); then
    cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
  fi
  local cxx=${CXX:-}
  if [[ -z $cxx ]]; then
    if command -v g++ >/dev/null 2>&1; then cxx=g++; else cxx=c++; fi
  fi
  mkdir -p "$build"
  local -a compile=("$cxx" -std=c++20 -O2 "-D_GLIBCXX_USE_CXX11_ABI=$abi"
    -I"$torch_dir/include" -I"$torch_dir/include/torch/csrc/api/include"
    ${cuda_home:+-I"$cuda_home/include"} -I"$dir"
    "$src" -o "$build/torch_alloc"
    -L"$torch_dir/lib" -L"$dir" -Wl,--no-as-needed -lc10_cuda -lc10 -lrmm_capi
    -Wl,-rpath,"$torch_dir/lib:$dir")
  echo "=== [torch-alloc] compiling torch_alloc.cpp: ${compile[*]}"
  local clog="$LOGS/torch-alloc-compile.log"
  if ! "${compile[@]}" >"$clog" 2>&1 || [[ ! -x $build/torch_alloc ]]; then
    RUN_LOGS+=("$clog")
    {
      echo "torch-alloc: compiling torch_alloc.cpp failed; the command:"
      echo "  ${compile[*]}"
      echo "the compiler's output (last 150 lines; all of it in logs/torch-alloc-compile.log):"
      tail -n 150 "$clog"
      echo "$fail_line"
    } >"$report"
    export_out "$report"
    cat "$report"
    return 1
  fi
  RUN_LOGS+=("$clog")
  echo "=== [torch-alloc] torch_alloc $*"
  run_captured "$LOGS/torch-alloc.log" env RMM_DEFAULT_STREAM=legacy \
    LD_LIBRARY_PATH="$torch_dir/lib:$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$build/torch_alloc" "$@"
  local rc=$RC last
  last=$(grep '^torch-alloc: .* sizes, ' "$LOGS/torch-alloc.log" | tail -n 1)
  {
    grep -v '^torch-alloc: .* sizes, ' "$LOGS/torch-alloc.log"
    echo "${last:-$TORCH_ALLOC_FAILED (no result: $(describe_exit "$rc"))}"
  } >"$report"
  export_out "$report"
  echo
  cat "$report"
  return "$rc"
}

# run_example NAME [ARGS...]: examples/NAME ARGS; returns its exit status.
run_example() {
  local name=${1:-}
  if [[ -z $name || ! -f $BUNDLE/examples/$name ]]; then
    echo "run.sh: no example '${name}'; examples in this bundle:" >&2
    (cd "$BUNDLE/examples" 2>/dev/null && ls -1) >&2
    return 2
  fi
  shift
  local report="$LOGS/summary.txt"
  run_captured "$LOGS/example--$name.log" "$BUNDLE/examples/$name" "$@"
  local rc=$RC
  echo "example $name: $(describe_exit "$rc")" >"$report"
  export_out "$report"
  cat "$report"
  return "$rc"
}

# The tools `sanitize` knows, in the order it runs them.
SANITIZE_TOOLS=(memcheck racecheck synccheck initcheck)

# find_sanitizer: prints the compute-sanitizer to use, or says on stderr why there is none.
find_sanitizer() {
  if [[ -n ${COMPUTE_SANITIZER:-} ]]; then
    if [[ -x $COMPUTE_SANITIZER ]]; then
      echo "$COMPUTE_SANITIZER"
      return 0
    fi
    echo "COMPUTE_SANITIZER=$COMPUTE_SANITIZER is not an executable file" >&2
    return 1
  fi
  if command -v compute-sanitizer >/dev/null 2>&1; then
    command -v compute-sanitizer
    return 0
  fi
  local c
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    if [[ -x $c ]]; then
      echo "$c"
      return 0
    fi
  done
  echo "compute-sanitizer is not on PATH, in /usr/local/cuda/bin or in /usr/local/cuda-*/bin" \
    "(it comes with the CUDA toolkit; set COMPUTE_SANITIZER to use another)" >&2
  return 1
}

# parse_sanitizer LOG: sets S_FOUND (0 or 1) and S_ERRORS from the last "ERROR SUMMARY: N
# errors" line, or else from the last "RACECHECK SUMMARY: ... (N errors, M warnings)" line.
parse_sanitizer() {
  S_FOUND=0 S_ERRORS=0
  local line found_race=0 race_errors=0 cr=$'\r'
  local re_err='ERROR SUMMARY: ([0-9]+) error'
  local re_race='RACECHECK SUMMARY: .*\(([0-9]+) errors?'
  while IFS= read -r line || [[ -n $line ]]; do
    [[ $line == *"SUMMARY:"* ]] || continue
    line=${line//"$cr"/}
    if [[ $line =~ $re_err ]]; then
      S_FOUND=1
      S_ERRORS=$((10#${BASH_REMATCH[1]}))
    elif [[ $line =~ $re_race ]]; then
      found_race=1
      race_errors=$((10#${BASH_REMATCH[1]}))
    fi
  done <"$1"
  if ((!S_FOUND && found_race)); then
    S_FOUND=1
    S_ERRORS=$race_errors
  fi
}

# test_groups BIN: the filters that split BIN's tests into groups, one per line in list order:
# a name's first two '::' components ("conformance::pool::"), else its part up to the last '/'
# ("stress/"), else the whole name. Prints nothing when BIN cannot list its tests.
test_groups() {
  (cd "$BUNDLE" && "$1" --list 2>/dev/null) | awk '
    /: test$/ {
      name = substr($0, 1, length($0) - 6)
      n = split(name, parts, "::")
      if (n > 2) { g = parts[1] "::" parts[2] "::" }
      else if (match(name, /.*\//)) { g = substr(name, 1, RLENGTH) }
      else { g = name }
      if (!(g in seen)) { seen[g] = 1; print g }
    }'
}

# splits_tool TOOL: whether TOOL is among RMM_SANITIZE_SPLIT.
splits_tool() {
  local t
  for t in ${RMM_SANITIZE_SPLIT-initcheck}; do
    [[ $t == "$1" ]] && return 0
  done
  return 1
}

# run_sanitize [TOOL...] [-- ARGS...]: the chosen test binaries under compute-sanitizer, once per
# tool and mode; prints a table, one line per tool and the verdict.
run_sanitize() {
  local -a tools=() args=() modes patterns bins=()
  while (($#)); do
    if [[ $1 == -- ]]; then
      shift
      args=("$@")
      break
    fi
    tools+=("$1")
    shift
  done
  ((${#tools[@]})) || tools=("${SANITIZE_TOOLS[@]}")
  local tool known t
  for tool in "${tools[@]}"; do
    known=0
    for t in "${SANITIZE_TOOLS[@]}"; do
      [[ $tool == "$t" ]] && known=1
    done
    if ((!known)); then
      echo "run.sh: sanitize: unknown tool '$tool' (use: ${SANITIZE_TOOLS[*]})" >&2
      return 2
    fi
  done
  read -r -a modes <<<"${RMM_SANITIZE_MODES:-legacy}"
  local mode
  for mode in "${modes[@]}"; do
    if [[ $mode != legacy && $mode != per-thread ]]; then
      echo "run.sh: unknown stream mode '$mode' in RMM_SANITIZE_MODES (use legacy and/or per-thread)" >&2
      return 2
    fi
  done
  if ((${#modes[@]} == 0)); then
    echo "run.sh: RMM_SANITIZE_MODES names no mode" >&2
    return 2
  fi
  read -r -a patterns <<<"${RMM_SANITIZE_BINS:-rmm-mr--gpu_stress rmm-mr--gpu_conformance rmm-containers--gpu_containers}"
  local pattern bin name matched
  shopt -s nullglob
  for pattern in "${patterns[@]}"; do
    matched=0
    for bin in "$BUNDLE"/bin/$pattern; do
      [[ -f $bin ]] || continue
      matched=1
      bins+=("$bin")
    done
    if ((!matched)); then
      shopt -u nullglob
      echo "run.sh: sanitize: no test binary in $BUNDLE/bin matches '$pattern' (RMM_SANITIZE_BINS)" >&2
      return 2
    fi
  done
  shopt -u nullglob

  local report="$LOGS/summary.txt" sanitizer
  if ! sanitizer=$(find_sanitizer 2>"$LOGS/sanitize-missing.txt"); then
    local why
    why=$(<"$LOGS/sanitize-missing.txt")
    {
      for tool in "${tools[@]}"; do
        echo "sanitize: $tool: 0 binaries, not run: no compute-sanitizer"
      done
      echo "sanitize: compute-sanitizer not found: $why"
    } >"$report"
    export_out "$report"
    echo "run.sh: sanitize needs NVIDIA's compute-sanitizer (CUDA toolkit) on the GPU machine" >&2
    cat "$report"
    return 3
  fi
  echo "=== [sanitize] $sanitizer"
  "$sanitizer" --version 2>&1 | head -n 3

  local -a rows=() tool_lines=() crashed=()
  local total_errors=0 total_failed=0 log status errors
  local saved_timeout=$TIMEOUT
  TIMEOUT=${RMM_SANITIZE_TIMEOUT:-150}
  for tool in "${tools[@]}"; do
    # API errors are not memory errors: the tests ask for impossible sizes on purpose, and the
    # driver's CUDA_ERROR_OUT_OF_MEMORY that the library turns into MrError::OutOfMemory would
    # otherwise count as sanitizer errors.
    local -a opts=(--tool "$tool" --error-exitcode 1 --report-api-errors no)
    [[ $tool == memcheck ]] && opts+=(--leak-check full)
    local t_errors=0 t_passed=0 t_failed=0 t_skipped=0
    for mode in "${modes[@]}"; do
      for bin in "${bins[@]}"; do
        name=${bin##*/}
        log="$LOGS/sanitize-$tool--$mode--$name.log"
        local -a groups=("")
        if ((${#args[@]} == 0)) && splits_tool "$tool"; then
          mapfile -t groups < <(test_groups "$bin")
          ((${#groups[@]})) || groups=("")
        fi
        local group part_log part=0 b_errors=0 b_passed=0 b_failed=0 b_ignored=0 b_crash=""
        local n_logs=${#RUN_LOGS[@]}
        : >"$log"
        for group in "${groups[@]}"; do
          part=$((part + 1))
          part_log=$log
          if ((${#groups[@]} > 1)); then
            part_log="$LOGS/sanitize-$tool--$mode--$name--part$part.log"
            echo "=== [sanitize $tool, $mode] $name $group"
          else
            echo "=== [sanitize $tool, $mode] $name"
          fi
          run_captured "$part_log" env RMM_DEFAULT_STREAM="$mode" RMM_STRESS_OPS="${RMM_STRESS_OPS:-40}" \
            "$sanitizer" "${opts[@]}" "$bin" --test-threads=1 ${group:+"$group"} "${args[@]}"
          parse_result "$part_log"
          parse_sanitizer "$part_log"
          errors=$S_ERRORS
          if ((S_FOUND)) && ((R_FOUND)); then
            if ((errors == 0 && R_FAILED == 0 && RC != 0)); then
              errors=1
              [[ -n $b_crash ]] || b_crash="exit: $(describe_exit "$RC")"
            fi
          else
            # No summary from the sanitizer or no result line from the binary: it did not finish.
            ((errors > 0)) || errors=1
            [[ -n $b_crash ]] || b_crash="CRASHED: $(describe_exit "$RC"), $( ((S_FOUND)) && echo "no test result line" || echo "no sanitizer summary")"
          fi
          b_errors=$((b_errors + errors))
          b_passed=$((b_passed + R_PASSED))
          b_failed=$((b_failed + R_FAILED))
          b_ignored=$((b_ignored + R_IGNORED))
          if [[ $part_log != "$log" ]]; then
            cat "$part_log" >>"$log"
            rm -f "$part_log"
          fi
        done
        RUN_LOGS=("${RUN_LOGS[@]:0:n_logs}" "$log")
        errors=$b_errors
        R_PASSED=$b_passed R_FAILED=$b_failed R_IGNORED=$b_ignored
        if [[ -n $b_crash ]]; then
          status=$b_crash
          crashed+=("$tool/$mode/$name ($status)")
        elif ((errors > 0)); then
          status="$errors sanitizer error(s)"
        elif ((R_FAILED > 0)); then
          status="tests FAILED"
        else
          status=ok
        fi
        t_errors=$((t_errors + errors))
        t_passed=$((t_passed + R_PASSED))
        t_failed=$((t_failed + R_FAILED))
        t_skipped=$((t_skipped + R_IGNORED))
        rows+=("$(printf '%-10s %-10s %-40s %5d errors %5d passed %5d failed %5d skipped  %s' \
          "$tool" "$mode" "$name" "$errors" "$R_PASSED" "$R_FAILED" "$R_IGNORED" "$status")")
      done
    done
    total_errors=$((total_errors + t_errors))
    total_failed=$((total_failed + t_failed))
    tool_lines+=("sanitize: $tool: ${#bins[@]} binaries (${modes[*]}), $t_errors errors, tests: $t_passed passed, $t_failed failed, $t_skipped skipped")
  done
  TIMEOUT=$saved_timeout
  {
    echo "--- per tool, mode and binary ---"
    printf '%s\n' "${rows[@]}"
    if ((${#crashed[@]})); then
      echo "--- did not finish normally (counted as one error each) ---"
      printf '%s\n' "${crashed[@]}"
    fi
    printf '%s\n' "${tool_lines[@]}"
    echo "sanitize: ${#tools[@]} tools, $total_errors errors, $total_failed failed tests"
  } >"$report"
  export_out "$report"
  echo
  cat "$report"
  ((total_errors == 0 && total_failed == 0))
}

# ---------------------------------------------------------------------------------------------
# --self-test: fake bundles with shell "binaries" that print libtest-style lines.

ST_CHECKS=0
ST_FAILS=0

# expect DESCRIPTION CMD...: one check; CMD must succeed.
expect() {
  local desc=$1
  shift
  ST_CHECKS=$((ST_CHECKS + 1))
  if ! "$@"; then
    ST_FAILS=$((ST_FAILS + 1))
    echo "self-test: FAILED: $desc"
  fi
}

# expect_eq DESCRIPTION ACTUAL EXPECTED
expect_eq() {
  expect "$1 (got '$2', want '$3')" test "$2" == "$3"
}

# file_has FILE TEXT: FILE exists and contains TEXT.
file_has() {
  [[ -f $1 ]] && [[ $(<"$1") == *"$2"* ]]
}

# fake PATH BODY: an executable bash script.
fake() {
  mkdir -p "$(dirname "$1")"
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$1"
  chmod +x "$1"
}

# new_bundle DIR: an empty bundle with a copy of this script.
new_bundle() {
  mkdir -p "$1/bin"
  cp "$SELF" "$1/run.sh"
}

# st_run NAME ENV... -- ARGS...: runs a fake bundle's run.sh (ARGS start with its path) with a
# clean environment for our variables; output to $tmp/NAME.txt, status to ST_RC.
st_run() {
  local name=$1
  shift
  local -a envs=()
  while [[ $1 != -- ]]; do
    envs+=("$1")
    shift
  done
  shift
  env -u RMM_GPU_MODES -u RMM_GPU_TIMEOUT -u RMM_GPU_LOG_LIMIT -u OUT -u RMM_BENCH_FILTER -u NVCC \
    -u COMPUTE_SANITIZER -u RMM_SANITIZE_BINS -u RMM_SANITIZE_MODES -u RMM_SANITIZE_TIMEOUT \
    -u RMM_SANITIZE_SPLIT \
    -u RMM_STRESS_OPS -u RMM_PEER_WRAP_ROUNDS -u RMM_PEER_AB_ROUNDS \
    -u RMM_PEER_REPLAY_ROUNDS -u RMM_PEER_REPLAY_OPS \
    -u PYTHON -u RMM_RS_LIBRARY -u RMM_REPLAY -u CXX -u CUDA_HOME \
    RMM_GPU_NVIDIA_LIB=/nonexistent "${envs[@]}" bash "$@" >"$tmp/$name.txt" 2>&1
  ST_RC=$?
}

self_test() {
  local tmp
  tmp=$(mktemp -d) || return 1
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  local result='test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s'
  local pass_body="echo \"mode=\$RMM_DEFAULT_STREAM args=\$* ld=\${LD_LIBRARY_PATH:-}\"
echo 'test gpu_alloc ... ok'
echo '$result'"

  # 1. A mixed bundle: passing, failing, crashing, and aborting after its result line.
  local b1=$tmp/b1
  new_bundle "$b1"
  fake "$b1/bin/pkg-a--pass" "$pass_body"
  fake "$b1/bin/pkg-a--fail" "echo 'test two ... FAILED'
printf 'test result: \\033[31mFAILED\\033[0m. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\\r\\n'
exit 101"
  fake "$b1/bin/pkg-b--crash" "echo 'running 2 tests'
ulimit -c 0
kill -SEGV \$\$"
  fake "$b1/bin/pkg-b--abort-after" "echo 'test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'
exit 134"
  fake "$b1/bench/pkg-a--pool" "echo \"bench args=\$* mode=\$RMM_DEFAULT_STREAM\""
  fake "$b1/examples/hello" "echo \"hello \$*\"; exit 3"
  mkdir -p "$tmp/nvlib"
  st_run mixed OUT="$tmp/out1" RMM_GPU_NVIDIA_LIB="$tmp/nvlib" LD_LIBRARY_PATH=/orig \
    -- "$b1/run.sh" test --exact myfilter
  expect_eq "mixed bundle exits 1" "$ST_RC" 1
  expect_eq "mixed bundle summary" "$(tail -n 1 "$tmp/mixed.txt")" "gpu: 12 passed, 8 failed, 2 skipped"
  expect "the crash is named with its signal" file_has "$tmp/mixed.txt" "legacy/pkg-b--crash (CRASHED: killed by SIGSEGV"
  expect "the late abort is named" file_has "$tmp/mixed.txt" "per-thread/pkg-b--abort-after (CRASHED after its result line: killed by SIGABRT"
  expect "test output is echoed" file_has "$tmp/mixed.txt" "running 2 tests"
  expect "table row of the failing binary" file_has "$tmp/mixed.txt" \
    "$(printf '%-10s %-44s %5d passed %5d failed %5d skipped  %s' legacy pkg-a--fail 1 2 0 FAILED)"
  expect "filters pass through after --test-threads=1" file_has "$b1/logs/legacy--pkg-a--pass.log" \
    "mode=legacy args=--test-threads=1 --exact myfilter"
  expect "per-thread mode is exported" file_has "$b1/logs/per-thread--pkg-a--pass.log" "mode=per-thread"
  expect "driver libraries come first on LD_LIBRARY_PATH" file_has "$b1/logs/legacy--pkg-a--pass.log" \
    "ld=$tmp/nvlib:/orig"
  expect "crash log exists" test -f "$b1/logs/per-thread--pkg-b--crash.log"
  expect "OUT gets the combined log" file_has "$tmp/out1/gpu-log.txt" "===== legacy--pkg-a--fail.log"
  expect_eq "combined log ends with the summary" "$(tail -n 1 "$tmp/out1/gpu-log.txt")" \
    "gpu: 12 passed, 8 failed, 2 skipped"
  expect_eq "OUT gets the summary" "$(tail -n 1 "$tmp/out1/gpu-summary.txt")" \
    "gpu: 12 passed, 8 failed, 2 skipped"
  expect_eq "OUT holds two files" "$(ls -A "$tmp/out1" | wc -l)" 2

  # 2. All passing, one mode, default command.
  local b2=$tmp/b2
  new_bundle "$b2"
  fake "$b2/bin/pkg-a--pass" "$pass_body"
  chmod -x "$b2/bin/pkg-a--pass"
  st_run pass RMM_GPU_MODES=legacy -- "$b2/run.sh"
  expect_eq "passing bundle exits 0" "$ST_RC" 0
  expect_eq "passing bundle summary" "$(tail -n 1 "$tmp/pass.txt")" "gpu: 3 passed, 0 failed, 1 skipped"
  expect "RMM_GPU_MODES=legacy skips per-thread" test ! -e "$b2/logs/per-thread--pkg-a--pass.log"
  st_run badmode RMM_GPU_MODES="legacy ptds" -- "$b2/run.sh"
  expect_eq "unknown mode exits 2" "$ST_RC" 2
  st_run nobench -- "$b2/run.sh" bench
  expect_eq "no benches is fine" "$ST_RC" 0
  expect "no benches is said" file_has "$tmp/nobench.txt" "no bench binaries"

  # 3. A silent binary, a hanging one and a failing bench.
  local b3=$tmp/b3
  new_bundle "$b3"
  fake "$b3/bin/x--silent" "exit 0"
  fake "$b3/bin/x--hang" "exec sleep 30"
  fake "$b3/bench/x--bad" "exit 3"
  st_run hang RMM_GPU_MODES=legacy RMM_GPU_TIMEOUT=1 -- "$b3/run.sh"
  expect_eq "silent and hanging binaries fail" "$(tail -n 1 "$tmp/hang.txt")" "gpu: 0 passed, 2 failed, 0 skipped"
  expect_eq "silent and hanging binaries exit 1" "$ST_RC" 1
  expect "the hang is named" file_has "$tmp/hang.txt" "legacy/x--hang (CRASHED: timed out after 1s"
  expect "the silent binary is named" file_has "$tmp/hang.txt" "legacy/x--silent (FAILED: exit status 0 but no test result line)"
  st_run badbench -- "$b3/run.sh" bench
  expect_eq "failing bench exits 1" "$ST_RC" 1
  expect_eq "failing bench summary" "$(tail -n 1 "$tmp/badbench.txt")" "bench: 1 ran, 1 failed"

  # 4. Benches, examples and an empty bundle.
  st_run bench -- "$b1/run.sh" bench --quick
  expect_eq "bench exits 0" "$ST_RC" 0
  expect "bench gets --bench ARGS under legacy" file_has "$b1/logs/bench--pkg-a--pool.log" \
    "bench args=--bench --quick mode=legacy"
  st_run example -- "$b1/run.sh" example hello a b
  expect_eq "example's exit status is returned" "$ST_RC" 3
  expect "example runs with its args" file_has "$tmp/example.txt" "hello a b"
  st_run noexample -- "$b1/run.sh" example nope
  expect_eq "missing example exits 2" "$ST_RC" 2
  local b4=$tmp/b4
  new_bundle "$b4"
  st_run empty -- "$b4/run.sh"
  expect "an empty bundle fails" test "$ST_RC" != 0

  # 5. Log export within a small budget: the big log is cut in the middle, the small one kept.
  local b5=$tmp/b5
  new_bundle "$b5"
  fake "$b5/bin/pkg-a--pass" "$pass_body"
  fake "$b5/bin/pkg-a--chatty" "for i in \$(seq 1 400); do echo \"line \$i of a long log ....................\"; done
echo '$result'"
  st_run cut OUT="$tmp/out5" RMM_GPU_LOG_LIMIT=4000 RMM_GPU_MODES=legacy -- "$b5/run.sh"
  local out5=$tmp/out5/gpu-log.txt
  expect_eq "cut bundle summary" "$(tail -n 1 "$tmp/cut.txt")" "gpu: 6 passed, 0 failed, 2 skipped"
  expect "the combined log stays near its budget" test "$(wc -c <"$out5")" -lt 4600
  expect "the big log is cut" file_has "$out5" "bytes from the middle of this log"
  expect "the big log keeps its head" file_has "$out5" "line 1 of a long log"
  expect "the big log keeps its tail" file_has "$out5" "line 400 of a long log"
  expect "the small log is whole" file_has "$out5" "mode=legacy args=--test-threads=1 ld="
  expect "the full log stays in logs/" file_has "$b5/logs/legacy--pkg-a--chatty.log" "line 200 of a long log"

  # 6. The bench filter.
  fake "$b1/bench/pkg-b--cpu" "echo cpu-bench-ran"
  st_run filtered RMM_BENCH_FILTER='pkg-a--*' -- "$b1/run.sh" bench
  expect_eq "filtered benches exit 0" "$ST_RC" 0
  expect_eq "the filter keeps one bench" "$(tail -n 1 "$tmp/filtered.txt")" "bench: 1 ran, 0 failed"
  expect "the filtered-out bench does not run" test ! -e "$b1/logs/bench--pkg-b--cpu.log"
  fake "$b1/bench/rmm-benches--fragmentation" "echo \"frag-ran \$*\""
  st_run frag -- "$b1/run.sh" frag --quick
  expect_eq "frag exits 0" "$ST_RC" 0
  expect_eq "frag runs one bench" "$(tail -n 1 "$tmp/frag.txt")" "bench: 1 ran, 0 failed"
  expect "frag passes its arguments" file_has "$tmp/frag.txt" "frag-ran --bench --quick"

  # 7. peer: fake wheels, a fake nvcc that "compiles" a fake rmm_peer, a fake examples/peer.
  local b7=$tmp/b7 w=$tmp/wheels
  new_bundle "$b7"
  mkdir -p "$b7/peer/wheels" "$w/librmm/include/rmm" "$w/librmm/include/rapids/cuda" \
    "$w/librmm/lib64" "$w/rapids_logger/include/rapids_logger" "$w/rapids_logger/lib64"
  echo '// driver' >"$b7/peer/rmm_peer.cpp"
  : >"$w/librmm/lib64/librmm.so"
  : >"$w/rapids_logger/lib64/librapids_logger.so"
  (cd "$w" && python3 -m zipfile -c "$b7/peer/wheels/librmm_cu13-26.10.0-py3-none-x.whl" librmm &&
    python3 -m zipfile -c "$b7/peer/wheels/rapids_logger-0.2.3-py3-none-x.whl" rapids_logger)
  expect "python3 makes the fake wheels" test -f "$b7/peer/wheels/rapids_logger-0.2.3-py3-none-x.whl"
  fake "$tmp/nvcc" "printf '%s\n' \"\$@\" >'$tmp/nvcc-args.txt'
out=
while ((\$#)); do [[ \$1 == -o ]] && out=\$2; shift; done
printf '#!/usr/bin/env bash\nif [[ \$1 == --frag ]]; then echo \"rmm_peer frag plan=\$2\"; echo rmm-frag-row >\"\$3\"; exit 0; fi\nif [[ \$1 == --replay ]]; then echo \"rmm_peer replay log=\$2 ld=\$LD_LIBRARY_PATH\"; exit 0; fi\necho \"rmm_peer plan=\$1 ld=\$LD_LIBRARY_PATH\"\nprintf \"rmm\\\\ta\\\\tpool\\\\t1\\\\t400.0\\\\t1024\\\\tok\\\\n\" >\"\$2\"\n' >\"\$out\"
chmod +x \"\$out\""
  fake "$tmp/nvcc-broken" "echo 'rmm_peer.cpp:1: error: boom' >&2; exit 1"
  fake "$b7/examples/peer" "case \$1 in
plan) echo \"plan args=\$*\"; printf 'rmm-peer-plan 1\\nreps 1\\nresource pool 0\\nresource async\\nresource cuda\\nresource fixed_size 8\\nresource naive 64\\nworkload a 1 2 x\\na 0 8\\nf 0\\nend\\n' >\"\$2\" ;;
run) printf 'rmm-rs\\ta\\tpool\\t1\\t100.0\\t1024\\tok\\n' >\"\$3\"; echo \"run mode=\$RMM_DEFAULT_STREAM\" ;;
report) echo \"report of \$(cat \"\$2\" \"\$3\" | wc -l) lines\"; echo 'peer: 1 cells compared, 0 failed' ;;
frag-plan) echo \"frag-plan args=\$*\"; echo frag-plan >\"\$2\" ;;
frag-run) echo rmm-rs-frag-row >\"\$3\"; echo \"frag-run mode=\$RMM_DEFAULT_STREAM\" ;;
frag-report) echo \"frag-report of \$(cat \"\$2\" \"\$3\")\"; echo 'peer-frag: 1 rmm-rs rows, 1 RMM rows, 0 failed' ;;
report-rounds) echo \"rounds ours=\$2 theirs=\$3\"; [[ -n \${FAKE_ROUNDS_FAIL:-} ]] && exit 1; echo 'peer-wrappers: 1 cells, 0 above 1.00' ;;
report-ab) echo \"ab before=\$2 after=\$3\"; head -n 1 \"\${2%%,*}\"; [[ -n \${FAKE_AB_FAIL:-} ]] && exit 1; echo 'memory: 0 of 1 cells'; echo 'peer-ab: 1 cells, 0 above 1.10' ;;
replay-prep) echo \"prep args=\$*\"; shift; d=\$1; shift; [[ \$1 == --synthetic ]] && shift 2; echo x >\"\$d/synthetic-a.csv\"; echo \"\$d/synthetic-a.csv\"; for l in \"\$@\"; do cp \"\$l\" \"\$d/01-\${l##*/}\"; echo \"\$d/01-\${l##*/}\"; done ;;
report-replay) echo \"replay-report \$*\"; [[ -n \${FAKE_REPLAY_FAIL:-} ]] && exit 1; echo 'peer-replay: 1 logs, 0 above 0.30' ;;
esac"
  st_run peer OUT="$tmp/out7" NVCC="$tmp/nvcc" -- "$b7/run.sh" peer --quick
  expect_eq "peer exits 0" "$ST_RC" 0
  expect_eq "peer's last line is the wrapper rounds'" "$(tail -n 1 "$tmp/peer.txt")" \
    "peer-wrappers: 1 cells, 0 above 1.00"
  expect "the main comparison's line stays in the summary" file_has "$b7/logs/summary.txt" \
    "$(printf 'report of 2 lines\npeer: 1 cells compared, 0 failed\n')"
  expect_eq "the summary ends with the wrapper rounds' line" "$(tail -n 1 "$b7/logs/summary.txt")" \
    "peer-wrappers: 1 cells, 0 above 1.00"
  expect_eq "peer runs 3 processes a side in ABBA order" \
    "$(grep -E '^wrapper cells, ' "$b7/logs/summary.txt" | cut -d: -f1 | tr '\n' ,)" \
    "wrapper cells, rmm process 1,wrapper cells, rmm-rs process 1,wrapper cells, rmm-rs process 2,wrapper cells, rmm process 2,wrapper cells, rmm process 3,wrapper cells, rmm-rs process 3,"
  expect_eq "the wrapper plan keeps async and cuda only" \
    "$(grep '^resource ' "$b7/peer/build/wrap-plan.txt" | tr '\n' ,)" "resource async,resource cuda,"
  expect_eq "and every other line of the main plan" \
    "$(grep -v '^resource ' "$b7/peer/build/wrap-plan.txt")" \
    "$(grep -v '^resource ' "$b7/peer/build/plan.txt")"
  expect "RMM's processes replay the wrapper plan" file_has "$b7/logs/peer-wrap-rmm-3.log" \
    "rmm_peer plan=$b7/peer/build/wrap-plan.txt ld=$b7/peer/build/librmm/librmm/lib64:"
  expect "rmm-rs's processes run in legacy mode" file_has "$b7/logs/peer-wrap-rmm-rs-3.log" \
    "run mode=legacy"
  expect "report-rounds gets the three processes a side" file_has "$b7/logs/peer-wrap-report.log" \
    "rounds ours=$b7/peer/build/wrap-rmm-rs-1.tsv,$b7/peer/build/wrap-rmm-rs-2.tsv,$b7/peer/build/wrap-rmm-rs-3.tsv theirs=$b7/peer/build/wrap-rmm-1.tsv,$b7/peer/build/wrap-rmm-2.tsv,$b7/peer/build/wrap-rmm-3.tsv"
  expect "OUT gets the wrapper report" file_has "$tmp/out7/peer-wrap-report.txt" "peer-wrappers: 1 cells"
  expect "OUT gets every wrapper process's results" file_has "$tmp/out7/peer-wrap-rmm-rs-3.tsv" "100.0"
  expect_eq "OUT's summary ends with the wrapper line" "$(tail -n 1 "$tmp/out7/gpu-summary.txt")" \
    "peer-wrappers: 1 cells, 0 above 1.00"
  expect "the plan gets the arguments" file_has "$b7/logs/peer-plan.log" "plan args=plan $b7/peer/build/plan.txt --quick"
  expect "nvcc compiles C++20" file_has "$tmp/nvcc-args.txt" "-std=c++20"
  expect_eq "the wheel's CCCL headers come first" "$(grep -m1 '^-I' "$tmp/nvcc-args.txt")" \
    "-I$b7/peer/build/librmm/librmm/include/rapids"
  expect "librmm is linked with an rpath" file_has "$tmp/nvcc-args.txt" \
    "$b7/peer/build/librmm/librmm/lib64:$b7/peer/build/rapids_logger/rapids_logger/lib64"
  expect "rmm_peer runs with the wheels' libraries" file_has "$b7/logs/peer-rmm.log" \
    "ld=$b7/peer/build/librmm/librmm/lib64:"
  expect "the rmm-rs side runs in legacy mode" file_has "$b7/logs/peer-rmm-rs.log" "run mode=legacy"
  expect "the report sees both results" file_has "$tmp/peer.txt" "report of 2 lines"
  expect "OUT gets RMM's results" file_has "$tmp/out7/peer-rmm.tsv" "400.0"
  expect "OUT gets the summary" file_has "$tmp/out7/gpu-summary.txt" "rmm_peer (RMM): exit status 0"
  st_run peer0 RMM_PEER_WRAP_ROUNDS=0 NVCC="$tmp/nvcc" -- "$b7/run.sh" peer
  expect_eq "RMM_PEER_WRAP_ROUNDS=0: peer exits 0" "$ST_RC" 0
  expect_eq "RMM_PEER_WRAP_ROUNDS=0: the last line is the comparison's" \
    "$(tail -n 1 "$tmp/peer0.txt")" "peer: 1 cells compared, 0 failed"
  expect "RMM_PEER_WRAP_ROUNDS=0: no wrapper process" test ! -e "$b7/peer/build/wrap-plan.txt"
  st_run peer1 RMM_PEER_WRAP_ROUNDS=1 FAKE_ROUNDS_FAIL=1 NVCC="$tmp/nvcc" -- "$b7/run.sh" peer
  expect_eq "a failed report-rounds fails peer" "$ST_RC" 1
  expect_eq "and says so last" "$(tail -n 1 "$tmp/peer1.txt")" \
    "peer-wrappers: 0 cells, 0 above 1.00 (no report: exit status 1)"
  expect_eq "RMM_PEER_WRAP_ROUNDS=1 runs one process a side" \
    "$(grep -c -E '^wrapper cells, ' "$b7/logs/summary.txt")" 2
  st_run peerbadrounds RMM_PEER_WRAP_ROUNDS=two NVCC="$tmp/nvcc" -- "$b7/run.sh" peer
  expect_eq "a bad RMM_PEER_WRAP_ROUNDS fails peer" "$ST_RC" 1
  st_run peerbroken NVCC="$tmp/nvcc-broken" -- "$b7/run.sh" peer
  expect_eq "a compile error exits 1" "$ST_RC" 1
  expect "the compile error is shown" file_has "$tmp/peerbroken.txt" "rmm_peer.cpp:1: error: boom"
  expect_eq "a compile error's last line" "$(tail -n 1 "$tmp/peerbroken.txt")" \
    "peer: 0 cells compared, 1 failed (compile error)"
  st_run nopeer -- "$b2/run.sh" peer
  expect_eq "a bundle without peer/ exits 2" "$ST_RC" 2
  expect "it says how to build one" file_has "$tmp/nopeer.txt" "cargo xtask gpu bundle --peer"
  st_run peerfrag OUT="$tmp/out7f" NVCC="$tmp/nvcc" -- "$b7/run.sh" peer-frag --quick
  expect_eq "peer-frag exits 0" "$ST_RC" 0
  expect_eq "peer-frag's last line" "$(tail -n 1 "$tmp/peerfrag.txt")" \
    "peer-frag: 1 rmm-rs rows, 1 RMM rows, 0 failed"
  expect "the frag plan gets the arguments" file_has "$b7/logs/peer-frag-plan.log" \
    "frag-plan args=frag-plan $b7/peer/build/frag-plan.txt --quick"
  expect "rmm_peer runs with --frag on the plan" file_has "$b7/logs/peer-frag-rmm.log" \
    "rmm_peer frag plan=$b7/peer/build/frag-plan.txt"
  expect "the rmm-rs frag side runs in legacy mode" file_has "$b7/logs/peer-frag-rmm-rs.log" \
    "frag-run mode=legacy"
  expect "the frag report sees rmm-rs's rows" file_has "$tmp/peerfrag.txt" \
    "frag-report of rmm-rs-frag-row"
  expect "and RMM's" file_has "$b7/logs/peer-frag-report.log" "rmm-frag-row"
  expect "OUT gets RMM's frag rows" file_has "$tmp/out7f/peer-frag-rmm.tsv" "rmm-frag-row"
  st_run peerfragbroken NVCC="$tmp/nvcc-broken" -- "$b7/run.sh" peer-frag
  expect_eq "a compile error fails peer-frag" "$ST_RC" 1
  expect_eq "peer-frag's compile error line" "$(tail -n 1 "$tmp/peerfragbroken.txt")" \
    "peer-frag: 0 rmm-rs rows, 0 RMM rows, 1 failed (compile error)"
  st_run nopeerfrag -- "$b2/run.sh" peer-frag
  expect_eq "peer-frag without peer/ exits 2" "$ST_RC" 2
  st_run peerwrap OUT="$tmp/out7w" NVCC="$tmp/nvcc" -- "$b7/run.sh" peer-wrap 2
  expect_eq "peer-wrap exits 0" "$ST_RC" 0
  expect_eq "peer-wrap's last line" "$(tail -n 1 "$tmp/peerwrap.txt")" \
    "peer-wrappers: 1 cells, 0 above 1.00"
  expect_eq "the processes alternate ABBA" \
    "$(grep -E '^wrapper cells, ' "$b7/logs/summary.txt" | cut -d: -f1 | tr '\n' ,)" \
    "wrapper cells, rmm process 1,wrapper cells, rmm-rs process 1,wrapper cells, rmm-rs process 2,wrapper cells, rmm process 2,"
  expect "peer-wrap plans afresh" file_has "$b7/logs/peer-wrap-plan.log" \
    "plan args=plan $b7/peer/build/wrap-plan-all.txt"
  expect "report-rounds gets every process's results" file_has "$b7/logs/peer-wrap-report.log" \
    "rounds ours=$b7/peer/build/wrap-rmm-rs-1.tsv,$b7/peer/build/wrap-rmm-rs-2.tsv theirs=$b7/peer/build/wrap-rmm-1.tsv,$b7/peer/build/wrap-rmm-2.tsv"
  st_run peerwrapbad NVCC="$tmp/nvcc" -- "$b7/run.sh" peer-wrap x
  expect_eq "a bad ROUNDS fails peer-wrap" "$ST_RC" 1
  # peer-wrap reuses the driver compiled before (a broken compiler shows it is not called)...
  touch -d @1000000000 "$b7/peer/rmm_peer.cpp" "$b7"/peer/wheels/*.whl
  st_run peerwrapreuse RMM_PEER_WRAP_ROUNDS=1 NVCC="$tmp/nvcc-broken" -- "$b7/run.sh" peer-wrap
  expect_eq "peer-wrap reuses the compiled driver" "$ST_RC" 0
  expect "and says so" file_has "$tmp/peerwrapreuse.txt" "reusing peer/build/rmm_peer"
  expect_eq "RMM_PEER_WRAP_ROUNDS sets peer-wrap's default" \
    "$(grep -c -E '^wrapper cells, ' "$b7/logs/summary.txt")" 2
  # ... but not one older than its source.
  touch -d "@$(($(date +%s) + 100))" "$b7/peer/rmm_peer.cpp"
  st_run peerwrapstale NVCC="$tmp/nvcc-broken" -- "$b7/run.sh" peer-wrap 1
  expect_eq "a newer rmm_peer.cpp is compiled again" "$ST_RC" 1
  expect_eq "peer-wrap's compile error line" "$(tail -n 1 "$tmp/peerwrapstale.txt")" \
    "peer-wrappers: 0 cells, 0 above 1.00 (compile error)"

  # 7b. peer-ab: a bundle with examples/peer only (no peer/: no wheels, no nvcc), a fake before
  # binary elsewhere; the plan of 7's fake examples/peer.
  local b7ab=$tmp/b7ab
  new_bundle "$b7ab"
  mkdir -p "$b7ab/examples"
  cp "$b7/examples/peer" "$b7ab/examples/peer"
  fake "$tmp/old/peer" "[[ \$1 == run ]] || exit 9
printf 'rmm-rs\\ta\\tpool\\t1\\t110.0\\t1024\\tok\\t8\\n' >\"\$3\"; echo \"old run plan=\$2 mode=\$RMM_DEFAULT_STREAM\""
  st_run peerab OUT="$tmp/out7ab" NVCC="$tmp/nvcc-broken" -- "$b7ab/run.sh" peer-ab "$tmp/old/peer" 2 --quick
  expect_eq "peer-ab exits 0" "$ST_RC" 0
  expect_eq "peer-ab's last line" "$(tail -n 1 "$tmp/peerab.txt")" "peer-ab: 1 cells, 0 above 1.10"
  expect "the memory line stays in the summary" file_has "$b7ab/logs/summary.txt" "memory: 0 of 1 cells"
  expect_eq "the processes alternate ABBA" \
    "$(grep -E '^sub-allocator cells, ' "$b7ab/logs/summary.txt" | cut -d: -f1 | tr '\n' ,)" \
    "sub-allocator cells, before process 1,sub-allocator cells, after process 1,sub-allocator cells, after process 2,sub-allocator cells, before process 2,"
  expect "the plan gets the arguments" file_has "$b7ab/logs/peer-ab-plan.log" \
    "plan args=plan $b7ab/peer-ab/plan-all.txt --quick"
  expect_eq "the plan keeps the sub-allocators only" \
    "$(grep '^resource ' "$b7ab/peer-ab/plan.txt" | tr '\n' ,)" "resource pool 0,resource fixed_size 8,"
  expect_eq "and every other line" "$(grep -v '^resource ' "$b7ab/peer-ab/plan.txt")" \
    "$(grep -v '^resource ' "$b7ab/peer-ab/plan-all.txt")"
  expect "the before binary runs the plan in legacy mode" file_has "$b7ab/logs/peer-ab-before-2.log" \
    "old run plan=$b7ab/peer-ab/plan.txt mode=legacy"
  expect "the after side is the bundle's" file_has "$b7ab/logs/peer-ab-after-2.log" "run mode=legacy"
  expect "report-ab gets each side's processes" file_has "$b7ab/logs/peer-ab-report.log" \
    "ab before=$b7ab/peer-ab/before-1.tsv,$b7ab/peer-ab/before-2.tsv after=$b7ab/peer-ab/after-1.tsv,$b7ab/peer-ab/after-2.tsv"
  expect "the before side's results are the old binary's" file_has "$b7ab/logs/peer-ab-report.log" "110.0"
  expect "OUT gets the report" file_has "$tmp/out7ab/peer-ab-report.txt" "peer-ab: 1 cells"
  expect "OUT gets every process's results" file_has "$tmp/out7ab/peer-ab-after-2.tsv" "100.0"
  expect_eq "OUT's summary ends with the peer-ab line" "$(tail -n 1 "$tmp/out7ab/gpu-summary.txt")" \
    "peer-ab: 1 cells, 0 above 1.10"
  expect "no compiler was needed" test ! -e "$b7ab/peer"
  (cd "$tmp/old" && RMM_PEER_AB_ROUNDS=1 RMM_GPU_NVIDIA_LIB=/nonexistent bash "$b7ab/run.sh" peer-ab ./peer \
    >"$tmp/peerabrel.txt" 2>&1)
  expect_eq "a relative before path and RMM_PEER_AB_ROUNDS" \
    "$(grep -c -E '^sub-allocator cells, ' "$b7ab/logs/summary.txt")" 2
  expect "the relative path is the caller's" file_has "$b7ab/logs/peer-ab-before-1.log" "old run plan="
  st_run peerabfail FAKE_AB_FAIL=1 -- "$b7ab/run.sh" peer-ab "$tmp/old/peer" 1
  expect_eq "a failed report-ab fails peer-ab" "$ST_RC" 1
  expect_eq "and says so last" "$(tail -n 1 "$tmp/peerabfail.txt")" \
    "peer-ab: 0 cells, 0 above 1.10 (no report: exit status 1)"
  st_run peerabnone -- "$b7ab/run.sh" peer-ab "$tmp/old/nothing"
  expect_eq "a missing before binary exits 2" "$ST_RC" 2
  expect_eq "and says so last" "$(tail -n 1 "$tmp/peerabnone.txt")" "peer-ab: 0 cells, 0 above 1.10 (no before binary)"
  st_run peerabnoarg -- "$b7ab/run.sh" peer-ab
  expect_eq "no before binary at all exits 2" "$ST_RC" 2
  st_run peerabbad -- "$b7ab/run.sh" peer-ab "$tmp/old/peer" 0
  expect_eq "ROUNDS 0 fails peer-ab" "$ST_RC" 1
  st_run peerabnopeer -- "$b2/run.sh" peer-ab "$tmp/old/peer"
  expect_eq "a bundle without examples/peer exits 2" "$ST_RC" 2

  # 7c. peer-replay: 7's bundle with a fake tools/rmm-replay and a log of its own.
  fake "$b7/tools/rmm-replay" "echo \"rmm-replay args=\$* mode=\$RMM_DEFAULT_STREAM\""
  echo 'Thread,Time,Action,Pointer,Size,Stream' >"$tmp/mine.csv"
  st_run peerreplay OUT="$tmp/out7r" RMM_PEER_REPLAY_ROUNDS=2 NVCC="$tmp/nvcc" -- "$b7/run.sh" peer-replay
  expect_eq "peer-replay exits 0" "$ST_RC" 0
  expect_eq "peer-replay's last line" "$(tail -n 1 "$tmp/peerreplay.txt")" \
    "peer-replay: 1 logs, 0 above 0.30"
  expect "without logs, the synthetic ones are made" file_has "$b7/logs/peer-replay-prep.log" \
    "prep args=replay-prep $b7/peer/build/replay --synthetic 200000"
  expect_eq "the processes alternate ABBA" \
    "$(grep -E '^synthetic-a.csv, ' "$b7/logs/summary.txt" | cut -d: -f1 | tr '\n' ,)" \
    "synthetic-a.csv, rmm process 1,synthetic-a.csv, rmm-rs process 1,synthetic-a.csv, rmm-rs process 2,synthetic-a.csv, rmm process 2,"
  expect "RMM's side replays the prepared log with the wheels' libraries" \
    file_has "$b7/logs/peer-replay-synthetic-a-rmm-2.log" \
    "rmm_peer replay log=$b7/peer/build/replay/synthetic-a.csv ld=$b7/peer/build/librmm/librmm/lib64:"
  expect "rmm-rs's side is rmm-replay's pool in legacy mode" \
    file_has "$b7/logs/peer-replay-synthetic-a-rmm-rs-2.log" \
    "rmm-replay args=--resource pool $b7/peer/build/replay/synthetic-a.csv mode=legacy"
  expect "report-replay gets the log's name and each side's processes" \
    file_has "$b7/logs/peer-replay-report.log" \
    "replay-report report-replay synthetic-a.csv $b7/logs/peer-replay-synthetic-a-rmm-rs-1.log,$b7/logs/peer-replay-synthetic-a-rmm-rs-2.log $b7/logs/peer-replay-synthetic-a-rmm-1.log,$b7/logs/peer-replay-synthetic-a-rmm-2.log"
  expect "OUT gets the report" file_has "$tmp/out7r/peer-replay-report.txt" "peer-replay: 1 logs"
  (cd "$tmp" && RMM_PEER_REPLAY_ROUNDS=1 RMM_GPU_NVIDIA_LIB=/nonexistent NVCC="$tmp/nvcc" \
    bash "$b7/run.sh" peer-replay mine.csv >"$tmp/peerreplaylog.txt" 2>&1)
  expect "a relative LOG is the caller's, without synthetic logs" file_has "$b7/logs/peer-replay-prep.log" \
    "prep args=replay-prep $b7/peer/build/replay $tmp/mine.csv"
  expect "and it is replayed" file_has "$b7/logs/peer-replay-01-mine-rmm-rs-1.log" \
    "rmm-replay args=--resource pool $b7/peer/build/replay/01-mine.csv"
  st_run peerreplayfail RMM_PEER_REPLAY_ROUNDS=1 FAKE_REPLAY_FAIL=1 NVCC="$tmp/nvcc" -- "$b7/run.sh" peer-replay
  expect_eq "a failed report-replay fails peer-replay" "$ST_RC" 1
  expect_eq "and says so last" "$(tail -n 1 "$tmp/peerreplayfail.txt")" \
    "peer-replay: 0 logs, 0 above 0.30 (no report: exit status 1)"
  st_run peerreplaybad RMM_PEER_REPLAY_ROUNDS=0 NVCC="$tmp/nvcc" -- "$b7/run.sh" peer-replay
  expect_eq "RMM_PEER_REPLAY_ROUNDS=0 fails peer-replay" "$ST_RC" 1
  st_run peerreplaynotool NVCC="$tmp/nvcc" -- "$b7ab/run.sh" peer-replay
  expect_eq "a bundle without tools/rmm-replay exits 2" "$ST_RC" 2
  expect "it says how to build one" file_has "$tmp/peerreplaynotool.txt" "cargo xtask gpu bundle --peer"

  # 8. sanitize: a fake compute-sanitizer that runs the binary and reports the errors it asks for
  # (lines "SANITIZER-ERROR <tool>"), in the two summary formats.
  local b8=$tmp/b8 san=$tmp/fake-sanitizer
  new_bundle "$b8"
  fake "$san" "printf '%s\n' \"\$*\" >>'$tmp/san-args.txt'
tool=memcheck ec=0
while [[ \$1 == --* ]]; do
  case \$1 in
  --tool) tool=\$2; shift 2 ;;
  --error-exitcode) ec=\$2; shift 2 ;;
  --leak-check|--report-api-errors) shift 2 ;;
  --version) echo 'fake compute-sanitizer 1.0'; exit 0 ;;
  *) shift ;;
  esac
done
echo '========= COMPUTE-SANITIZER'
out=\$(\"\$@\"); rc=\$?
printf '%s\n' \"\$out\"
n=\$(grep -c \"^SANITIZER-ERROR \$tool\\\$\" <<<\"\$out\")
if [[ \$tool == racecheck ]]; then
  echo \"========= RACECHECK SUMMARY: \$n hazards displayed (\$n errors, 0 warnings)\"
else
  echo \"========= ERROR SUMMARY: \$n errors\"
fi
((n > 0 && ec != 0)) && exit \$ec
exit \$rc"
  fake "$b8/bin/rmm-mr--gpu_stress" "echo \"stress mode=\$RMM_DEFAULT_STREAM ops=\$RMM_STRESS_OPS args=\$*\"
echo '$result'"
  fake "$b8/bin/rmm-mr--gpu_conformance" "echo 'SANITIZER-ERROR memcheck'
echo 'SANITIZER-ERROR memcheck'
echo 'SANITIZER-ERROR racecheck'
echo '$result'"
  fake "$b8/bin/rmm-containers--gpu_containers" "echo '$result'"
  fake "$b8/bin/rmm-sys--gpu_sys" "echo 'not chosen'; echo '$result'"
  st_run sanclean OUT="$tmp/out8" COMPUTE_SANITIZER="$san" RMM_SANITIZE_BINS="rmm-mr--gpu_stress" \
    -- "$b8/run.sh" sanitize memcheck racecheck -- stress/ --exact
  expect_eq "a clean sanitize run exits 0" "$ST_RC" 0
  expect_eq "a clean sanitize run's last line" "$(tail -n 1 "$tmp/sanclean.txt")" \
    "sanitize: 2 tools, 0 errors, 0 failed tests"
  expect "one line per tool" file_has "$tmp/sanclean.txt" \
    "sanitize: racecheck: 1 binaries (legacy), 0 errors, tests: 3 passed, 0 failed, 1 skipped"
  expect "memcheck checks leaks" file_has "$tmp/san-args.txt" \
    "--tool memcheck --error-exitcode 1 --report-api-errors no --leak-check full $b8/bin/rmm-mr--gpu_stress --test-threads=1 stress/ --exact"
  expect "racecheck without leak checking" file_has "$tmp/san-args.txt" \
    "--tool racecheck --error-exitcode 1 --report-api-errors no $b8/bin/rmm-mr--gpu_stress"
  expect "legacy mode and 40 stress operations by default" file_has \
    "$b8/logs/sanitize-memcheck--legacy--rmm-mr--gpu_stress.log" "stress mode=legacy ops=40 args=--test-threads=1 stress/ --exact"
  expect "OUT gets the sanitize summary" file_has "$tmp/out8/gpu-summary.txt" "sanitize: memcheck: 1 binaries"
  : >"$tmp/san-args.txt"
  st_run sandefault COMPUTE_SANITIZER="$san" RMM_STRESS_OPS=7 RMM_SANITIZE_MODES="legacy per-thread" \
    -- "$b8/run.sh" sanitize
  expect_eq "errors make sanitize exit 1" "$ST_RC" 1
  expect_eq "the default run's last line" "$(tail -n 1 "$tmp/sandefault.txt")" \
    "sanitize: 4 tools, 6 errors, 0 failed tests"
  expect "memcheck's errors are counted per mode" file_has "$tmp/sandefault.txt" \
    "sanitize: memcheck: 3 binaries (legacy per-thread), 4 errors, tests: 18 passed, 0 failed, 6 skipped"
  expect "racecheck's summary format is read" file_has "$tmp/sandefault.txt" \
    "sanitize: racecheck: 3 binaries (legacy per-thread), 2 errors"
  expect "initcheck runs by default" file_has "$tmp/sandefault.txt" "sanitize: initcheck: 3 binaries"
  expect "the default binaries exclude others" test ! -e "$b8/logs/sanitize-memcheck--legacy--rmm-sys--gpu_sys.log"
  expect "RMM_STRESS_OPS is kept when set" file_has \
    "$b8/logs/sanitize-synccheck--per-thread--rmm-mr--gpu_stress.log" "mode=per-thread ops=7"
  fake "$b8/bin/rmm-mr--gpu_stress" "ulimit -c 0; kill -SEGV \$\$"
  st_run sancrash COMPUTE_SANITIZER="$san" RMM_SANITIZE_BINS="rmm-mr--gpu_stress rmm-containers--*" \
    -- "$b8/run.sh" sanitize synccheck
  expect_eq "a crash under the sanitizer exits 1" "$ST_RC" 1
  expect "a crash is one error" file_has "$tmp/sancrash.txt" \
    "sanitize: synccheck: 2 binaries (legacy), 1 errors, tests: 3 passed, 0 failed, 1 skipped"
  expect "the crash is named" file_has "$tmp/sancrash.txt" "synccheck/legacy/rmm-mr--gpu_stress (CRASHED"
  st_run sanmissing COMPUTE_SANITIZER=/nonexistent/compute-sanitizer -- "$b8/run.sh" sanitize memcheck
  expect_eq "a missing compute-sanitizer exits 3" "$ST_RC" 3
  expect_eq "its last line says why" "$(tail -n 1 "$tmp/sanmissing.txt")" \
    "sanitize: compute-sanitizer not found: COMPUTE_SANITIZER=/nonexistent/compute-sanitizer is not an executable file"
  expect "a missing compute-sanitizer is said per tool" file_has "$tmp/sanmissing.txt" \
    "sanitize: memcheck: 0 binaries, not run: no compute-sanitizer"
  expect "and why" file_has "$tmp/sanmissing.txt" \
    "sanitize: compute-sanitizer not found: COMPUTE_SANITIZER=/nonexistent/compute-sanitizer is not an executable file"
  # initcheck runs a binary once per test group; the parts' counts add up in one log.
  fake "$b8/bin/rmm-mr--gpu_conformance" "if [[ \$1 == --list ]]; then
  printf '%s\n' 'conformance::a::x: test' 'conformance::a::y: test' 'conformance::b::x: test' 'other/t1: test'
  exit 0
fi
echo \"group args=\$*\"
[[ \$* == *conformance::b::* ]] && echo 'SANITIZER-ERROR initcheck'
echo '$result'"
  : >"$tmp/san-args.txt"
  st_run sansplit COMPUTE_SANITIZER="$san" RMM_SANITIZE_BINS="rmm-mr--gpu_conformance" \
    -- "$b8/run.sh" sanitize initcheck memcheck
  expect "initcheck's groups add up" file_has "$tmp/sansplit.txt" \
    "sanitize: initcheck: 1 binaries (legacy), 1 errors, tests: 9 passed, 0 failed, 3 skipped"
  expect "memcheck runs the binary once" file_has "$tmp/sansplit.txt" \
    "sanitize: memcheck: 1 binaries (legacy), 0 errors, tests: 3 passed, 0 failed, 1 skipped"
  local g
  for g in conformance::a:: conformance::b:: other/; do
    expect "initcheck runs the group $g" file_has "$tmp/san-args.txt" \
      "--tool initcheck --error-exitcode 1 --report-api-errors no $b8/bin/rmm-mr--gpu_conformance --test-threads=1 $g"
  done
  expect "one log holds every group" file_has \
    "$b8/logs/sanitize-initcheck--legacy--rmm-mr--gpu_conformance.log" "group args=--test-threads=1 other/"
  expect "the parts' logs are gone" test ! -e "$b8/logs/sanitize-initcheck--legacy--rmm-mr--gpu_conformance--part1.log"
  st_run sannosplit COMPUTE_SANITIZER="$san" RMM_SANITIZE_BINS="rmm-mr--gpu_conformance" RMM_SANITIZE_SPLIT= \
    -- "$b8/run.sh" sanitize initcheck
  expect "RMM_SANITIZE_SPLIT empty: one run" file_has "$tmp/sannosplit.txt" \
    "sanitize: initcheck: 1 binaries (legacy), 0 errors, tests: 3 passed, 0 failed, 1 skipped"
  st_run sanargs COMPUTE_SANITIZER="$san" RMM_SANITIZE_BINS="rmm-mr--gpu_conformance" \
    -- "$b8/run.sh" sanitize initcheck -- conformance::b::
  expect "ARGS given: one run" file_has "$tmp/sanargs.txt" \
    "sanitize: initcheck: 1 binaries (legacy), 1 errors, tests: 3 passed, 0 failed, 1 skipped"
  st_run sanbadtool COMPUTE_SANITIZER="$san" -- "$b8/run.sh" sanitize leakcheck
  expect_eq "an unknown tool exits 2" "$ST_RC" 2
  st_run sannobin COMPUTE_SANITIZER="$san" RMM_SANITIZE_BINS="nope--*" -- "$b8/run.sh" sanitize memcheck
  expect_eq "a pattern that matches no binary exits 2" "$ST_RC" 2
  expect "it names the pattern" file_has "$tmp/sannobin.txt" "matches 'nope--*'"

  # 9. torch: the C programs (one crashes without a result line), the Python tests through a
  # fake python, and torch-bench.
  local b9=$tmp/b9
  new_bundle "$b9"
  mkdir -p "$b9/capi/python/tests" "$b9/tools"
  : >"$b9/capi/librmm_capi.so"
  : >"$b9/capi/python/tests/test_ctypes.py"
  : >"$b9/capi/python/tests/test_torch.py"
  : >"$b9/capi/python/bench_torch.py"
  : >"$b9/capi/rmm_rs_torch-0.1.0-py3-none-linux_x86_64.whl"
  fake "$b9/capi/test_capi" "echo \"scratch=\$1 lib=\$RMM_RS_LIBRARY\"; echo 'test_capi: 3 passed, 0 failed, 1 skipped'"
  fake "$b9/capi/test_torch_shim" "echo 'running'; exit 134"
  # The fake python makes a venv of itself (and a pip that says what it was asked).
  fake "$tmp/python" "case \$1 in
-m) mkdir -p \"\$4/bin\"; cp \"\$0\" \"\$4/bin/python\"
  printf '#!/usr/bin/env bash\\necho \"pip \$*\"\\n' >\"\$4/bin/pip\"; chmod +x \"\$4/bin/pip\" ;;
-c) echo \"enable(): \$2\" ;;
*test_ctypes.py) echo \"ctypes lib=\${RMM_RS_LIBRARY:-unset} python=\$0\"; printf 'test_ctypes: 2 passed, 0 failed, 1 skipped\r\n' ;;
*test_torch.py) echo \"torch args=\${*:2} replay=\$RMM_REPLAY mode=\$RMM_DEFAULT_STREAM\"
  echo '    over-maximum exception: builtins.RuntimeError: std::bad_alloc: out_of_memory: x'
  echo 'test_torch: 6 passed, 1 failed, 0 skipped'; exit 1 ;;
*bench_torch.py) echo 'noise'; echo 'torch 2.11 on H100; medians'; echo \"row args=\${*:2}\" ;;
esac"
  st_run torch OUT="$tmp/out9" PYTHON="$tmp/python" -- "$b9/run.sh" torch --fast
  expect_eq "torch exits 1" "$ST_RC" 1
  expect_eq "torch's last line" "$(tail -n 1 "$tmp/torch.txt")" "torch: 12 passed, 2 failed, 2 skipped"
  expect "the wheel is installed offline" file_has "$b9/logs/torch--wheel.log" \
    "pip install --no-index $b9/capi/rmm_rs_torch-0.1.0-py3-none-linux_x86_64.whl"
  expect "the Python tests run with the venv's python, without RMM_RS_LIBRARY" \
    file_has "$b9/logs/torch--test_ctypes.log" "ctypes lib=unset python=$b9/logs/torch-scratch/venv/bin/python"
  expect "the library is exported" file_has "$b9/logs/torch--test_capi.log" "lib=$b9/capi/librmm_capi.so"
  expect "test_capi gets a scratch folder" file_has "$b9/logs/torch--test_capi.log" "scratch=$b9/logs/torch-scratch"
  expect "the crash is named" file_has "$tmp/torch.txt" "test_torch_shim        0 passed     1 failed     0 skipped  CRASHED: killed by SIGABRT, no result line"
  expect "test_torch gets the replay tool and ARGS" file_has "$b9/logs/torch--test_torch.log" \
    "torch args=--replay $b9/tools/rmm-replay --fast replay=$b9/tools/rmm-replay mode=legacy"
  expect "the exception class is in the report" file_has "$tmp/out9/gpu-summary.txt" "over-maximum exception: builtins.RuntimeError"
  st_run torchbench PYTHON="$tmp/python" -- "$b9/run.sh" torch-bench --repeats 3
  expect_eq "torch-bench exits 0" "$ST_RC" 0
  expect_eq "torch-bench's last line" "$(tail -n 1 "$tmp/torchbench.txt")" "torch-bench: exit status 0"
  expect "the table is the report" file_has "$b9/logs/summary.txt" "row args=--library $b9/capi/librmm_capi.so --repeats 3"
  expect "noise before the table is left out" test "$(grep -c noise "$b9/logs/summary.txt")" == 0
  # torch-alloc: a fake python that says where a fake torch is, a fake compiler.
  mkdir -p "$tmp/torchpkg/include" "$tmp/torchpkg/lib" "$b9/capi/python/tools"
  : >"$b9/capi/python/tools/torch_alloc.cpp"
  fake "$tmp/python-ta" "echo '$tmp/torchpkg'; echo 1"
  fake "$tmp/cxx" "printf '%s\n' \"\$@\" >'$tmp/cxx-args.txt'
out=
while ((\$#)); do [[ \$1 == -o ]] && out=\$2; shift; done
printf '#!/usr/bin/env bash\necho \"alloc args=\$* ld=\$LD_LIBRARY_PATH\"\necho \"torch-alloc: 4 sizes, 1 above 1.00\"\n' >\"\$out\"
chmod +x \"\$out\""
  st_run torchalloc PYTHON="$tmp/python-ta" CXX="$tmp/cxx" CUDA_HOME=/cuda -- "$b9/run.sh" torch-alloc --rounds 3
  expect_eq "torch-alloc exits 0" "$ST_RC" 0
  expect_eq "torch-alloc's last line" "$(tail -n 1 "$tmp/torchalloc.txt")" "torch-alloc: 4 sizes, 1 above 1.00"
  expect "the program gets ARGS and torch's libraries" file_has "$b9/logs/torch-alloc.log" \
    "alloc args=--rounds 3 ld=$tmp/torchpkg/lib:$b9/capi"
  expect "the C++ ABI is torch's" file_has "$tmp/cxx-args.txt" "-D_GLIBCXX_USE_CXX11_ABI=1"
  expect "torch's headers" file_has "$tmp/cxx-args.txt" "-I$tmp/torchpkg/include"
  expect "CUDA's headers" file_has "$tmp/cxx-args.txt" "-I/cuda/include"
  expect "the libraries" file_has "$tmp/cxx-args.txt" "$(printf -- '-lc10_cuda\n-lc10\n-lrmm_capi')"
  st_run torchallocbroken PYTHON="$tmp/python-ta" CXX="$tmp/nvcc-broken" CUDA_HOME=/cuda -- "$b9/run.sh" torch-alloc
  expect_eq "a compile error fails torch-alloc" "$ST_RC" 1
  expect "the compile error is shown" file_has "$tmp/torchallocbroken.txt" "rmm_peer.cpp:1: error: boom"
  expect "with the command" file_has "$tmp/torchallocbroken.txt" "-lc10_cuda -lc10 -lrmm_capi"
  expect_eq "torch-alloc's compile error line" "$(tail -n 1 "$tmp/torchallocbroken.txt")" \
    "torch-alloc: 0 sizes, 0 above 1.00 (compile error)"
  st_run torchallocnotorch PYTHON="$tmp/python" CXX="$tmp/cxx" -- "$b9/run.sh" torch-alloc
  expect_eq "torch-alloc without torch fails" "$ST_RC" 1
  expect "and says so last" file_has "$tmp/torchallocnotorch.txt" "torch-alloc: 0 sizes, 0 above 1.00 (no torch)"
  st_run notorch -- "$b2/run.sh" torch
  expect_eq "a bundle without capi/ exits 2" "$ST_RC" 2

  if ((ST_FAILS > 0)); then
    local f
    for f in "$tmp"/*.txt; do
      printf '\n----- %s -----\n' "${f##*/}"
      cat "$f"
    done
    echo "run.sh self-test: $ST_FAILS of $ST_CHECKS checks failed"
    return 1
  fi
  echo "run.sh self-test: all $ST_CHECKS checks passed"
}

# ---------------------------------------------------------------------------------------------

main() {
  case "${1:-test}" in
  --help | -h | help)
    usage
    ;;
  --self-test)
    self_test
    ;;
  bench)
    shift
    setup_env
    run_benches "$@"
    ;;
  frag)
    shift
    setup_env
    RMM_BENCH_FILTER='*--fragmentation' run_benches "$@"
    ;;
  peer)
    shift
    setup_env
    run_peer "$@"
    ;;
  peer-wrap)
    shift
    setup_env
    run_peer_wrap "$@"
    ;;
  peer-frag)
    shift
    setup_env
    run_peer_frag "$@"
    ;;
  peer-latency)
    shift
    setup_env
    run_peer_latency "$@"
    ;;
  peer-ab)
    shift
    setup_env
    run_peer_ab "$@"
    ;;
  peer-replay)
    shift
    setup_env
    run_peer_replay "$@"
    ;;
  example)
    shift
    setup_env
    run_example "$@"
    ;;
  sanitize)
    shift
    setup_env
    run_sanitize "$@"
    ;;
  torch)
    shift
    setup_env
    run_torch "$@"
    ;;
  torch-bench)
    shift
    setup_env
    run_torch_bench "$@"
    ;;
  torch-alloc)
    shift
    setup_env
    run_torch_alloc "$@"
    ;;
  test)
    (($#)) && shift
    setup_env
    run_tests "$@"
    ;;
  *)
    setup_env
    run_tests "$@"
    ;;
  esac
}

main "$@"
