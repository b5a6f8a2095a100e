#!/usr/bin/env bash
# One GPU session's checks and measurements, in stages that each fit one device call (10 minutes):
#   check  build, the GPU test suite (slowest tests listed; the cluster kernel's correctness matrix only with
#          FULL=1), the host-overhead harness (ROUNDS rounds, 15 unless set, in what is left of 570 s)
#   bench  build, compute-sanitizer on a stream kernel, the wgmma GEMM probe against torch.mm, and the
#          stream kernel timed against PyTorch eager in CUDA graphs (the paper's table and decode
#          shapes, the decode set twice for run-to-run agreement; GEMM=0 and DECODE_RUNS=1 shorten it)
#   fit    build, the stream sweeps (every SWEEP and DECODE shape's candidate plans timed against eager,
#          several calls per CUDA graph) and benchmarks/fit_stream.py on them: the rows a cost-model refit needs
#          (AFTER=1: each plan and eager also after a copy writing their input, and the fit to those times)
#   prefill build, the stream checks (smoke run, GPU tests, memcheck), the prefill sweep
#          (stream plans of several row tiles timed against eager) and traces of three of them
#   epilogue build, then ncu on one GPT-2 prefill launch (2048 tokens, bm 128 bn 256 bl 128, 1/1): the
#          full set with source counters, and per-SASS-line samples exported as CSV (stall reasons by
#          instruction: what docs/kernels.md step 16 started from)
#   trace  build, then the unit traces of `kernel_check.py --trace` (the paper's 128-token chains and
#          decode plans) and `--trace prefill`: each unit's main loop, data wait and epilogue per phase
#   pairs  build, the GEMM probe, a smoke run of both kinds of cluster pairs (stopping there if it fails or
#          hangs), the stream kernel's GPU tests, memcheck on its sanitizer workload, then `kernel_check.py
#          --pairs` (pairs against single blocks, timed against eager and traced)
#   onephase build, a smoke run of the sanitizer workload, the stream kernel's GPU tests, memcheck, then
#          `kernel_check.py --one-phase` (one-phase plans against two-phase ones, timed and traced)
#   eager  build, the eager route's GPU tests (packed gate-and-up GEMM, cuBLASLt epilogue, gate kernel, kept
#          routes, the exchange API), memcheck on the gate kernel, benchmarks/eager_gate.py and eager_epilogue.py,
#          and the FP8 picks at 576 tokens beside PyTorch's FP8 ops (fp8_decode.py)
#   zerobias build, the zero-bias epilogue's and out='s GPU tests, then benchmarks/eager_epilogue.py --zero-bias
#          twice: bias-free ReLU chains (the paper's G4-G10, T5's) on fuser's eager route with the up GEMM's
#          epilogue over a zero bias switched on, beside the ops (docs/kernels.md, "Next kernels" 12)
#   cells  build, `pick_diff.py time --route` twice on each committed cells file (benchmarks/results/*-cells.json:
#          a model or search change's picks beside the old ones, eager and fuser's eager route; CELLS=NAME
#          takes the file of that name, else the files whose name holds NAME)
#   plans  build, `pick_diff.py plans` twice on each committed list of plans (benchmarks/results/*-plans.txt: one
#          NAME:M:constraints spec per line, the plans a model change needs timed; PLANS=NAME takes the file of that
#          name, else the files whose name holds NAME; TRACE=1 adds each plan's unit trace, LAYOUTS=1 each gated plan over gate and up packed,
#          WARM=1 each plan over one input set, its weights kept in the L2, EXACT=1 each plan with exact token boxes,
#          LEADS=0 each plan with the ring's first pass requested whole, LEADS=N,M with those first-pass leads in bytes,
#          AGAIN=1 each plan's graph captured a second time as it is: the spread the other ratios are read against,
#          AFTER=1 each plan and eager also after a copy writing their input (the copies timed alone and taken off),
#          and `pick_diff.py ab` on both runs: the cells where a setting lies beyond that spread in both)
#   sanitize build, then compute-sanitizer's memcheck, racecheck and synccheck on the stream kernel's workload
#          (tests/gpu/sanitize_stream.py) and on the gate kernel's (tests/gpu/sanitize_gate.py): what a tree whose
#          kernels changed owes before its numbers are reported
#   graphs build, the graph_calls benchmark's GPU test, then benchmarks/graph_calls.py --after-op: eager and fuser's
#          picks in CUDA graphs of 1, 4 and 16 calls and after a copy of their input (what the harness's calls per
#          graph and fuser's early launch after its own kernel add to a call's time)
#   host   build, benchmarks/host_overhead.py as the layering issue measures it (the thread's CPU clock, ROUNDS (31) rounds,
#          the C calls inside the routes timed apart)
#   targets build, one harness run of every workload the issues' speed targets name (`fuser bench --set targets`;
#          RUN=a or b names it; GRAPH_CALLS=N sets its --graph-calls, GRAPH_AFTER=self|op its --graph-after) and
#          its scorecard (`--score`)
#   all    check and bench, one after the other (a machine without a 10-minute limit)
#   queue  the stages in QUEUE (words STAGE or STAGE:VAR=VALUE, several settings joined by +, e.g. "host
#          cells:CELLS=margin plans:PLANS=lead+LEADS=0+AGAIN=1"; an exported variable reaches every stage), in order,
#          each started only where its usual time (STAGE_SECONDS below) fits in what is left of BUDGET seconds (570):
#          a call that a refusal or a slow start shortened still brings back every stage it finished, each as its
#          own archive, with the summaries one after another in $OUT/gpu.txt
# Logs go to $OUT/results-<stage>.tgz (OUT defaults to ./gpu-out), the one-line summaries to $OUT/gpu.txt.
#     bash benchmarks/gpu_session.sh STAGE    (one of the stages above; `bash benchmarks/gpu_session.sh -h` lists them)
set -uo pipefail
STAGE=${1:-all}
STAGES="check|bench|fit|prefill|epilogue|trace|pairs|onephase|eager|zerobias|cells|plans|sanitize|graphs|host"
STAGES="$STAGES|targets|all|queue"
case "|$STAGES|" in *"|$STAGE|"*) ;; *) echo "usage: $0 $STAGES" >&2; exit 2;; esac
SELF=$(readlink -f "$0")
cd "$(dirname "$SELF")/.."
FINAL=$(mkdir -p "${OUT:-gpu-out}" && readlink -f "${OUT:-gpu-out}")
# The committed files the cells and plans stages time: CELLS or PLANS names one file (its name, with or without its
# -cells.json or -plans.txt) or, where no file has that name, the files whose names hold it; a name that matches
# none stops the stage before the build.
CELLS=${CELLS:-}; CELLS=${CELLS%.json}; CELLS=${CELLS%-cells}
PLANS=${PLANS:-}; PLANS=${PLANS%.txt}; PLANS=${PLANS%-plans}
lists() {   # lists NAME SUFFIX
    if [ -n "$1" ] && [ -e "benchmarks/results/$1$2" ]; then echo "benchmarks/results/$1$2"
    else echo "benchmarks/results/*$1*$2"; fi
}
case $STAGE in
    cells) LISTS=$(lists "$CELLS" -cells.json) ;;
    plans) LISTS=$(lists "$PLANS" -plans.txt) ;;
    *) LISTS= ;;
esac
if [ -n "$LISTS" ] && ! compgen -G "$LISTS" > /dev/null; then
    echo "$STAGE: no file matches $LISTS" | tee -a "$FINAL/gpu.txt" >&2
    exit 2
fi
# Seconds each stage usually takes on the H200 or an H100 (build included), for the queue's budget (targets: 54-141 s
# over seven H100 runs, so that it queues after a cells stage; sanitize: part of a 108 s H100 call that also ran a
# plans stage and a benchmark, its six tools' runs each under a 90 s timeout).
declare -A STAGE_SECONDS=([check]=330 [bench]=480 [fit]=560 [prefill]=420 [epilogue]=420 [trace]=300 [pairs]=450
    [onephase]=360 [eager]=480 [zerobias]=160 [cells]=240 [plans]=300 [sanitize]=150 [graphs]=120
    [host]=260 [targets]=200)
if [ "$STAGE" = queue ]; then
    mkdir -p "$FINAL"
    start=$SECONDS budget=${BUDGET:-570}
    : > "$FINAL/queue.txt"
    for item in ${QUEUE:?QUEUE names the stages to run, e.g. QUEUE="host zerobias"}; do
        name=${item%%:*} setting=$([ "$item" = "${item#*:}" ] || echo "${item#*:}")
        IFS=+ read -r -a settings <<< "$setting"
        est=${STAGE_SECONDS[$name]:-}
        left=$((budget - (SECONDS - start)))
        if [ -z "$est" ] || [ "$name" = queue ] || [ "$name" = all ]; then
            echo "queue: $item is not a stage the queue runs" | tee -a "$FINAL/queue.txt"; continue
        fi
        if [ "$est" -gt "$left" ]; then
            echo "queue: $item left out (usually ${est} s, ${left} s left)" | tee -a "$FINAL/queue.txt"; continue
        fi
        echo "== queue: $name${settings[*]:+ with ${settings[*]}} (${left} s left)" | tee -a "$FINAL/queue.txt"
        env "${settings[@]}" OUT="$FINAL" bash "$SELF" "$name" > "$FINAL/stage.log" 2>&1
        echo "queue: $item rc $? in $((SECONDS - start - (budget - left))) s" | tee -a "$FINAL/queue.txt"
        cat "$FINAL/gpu.txt" >> "$FINAL/queue.txt" 2>/dev/null
        rm -f "$FINAL/gpu.txt" "$FINAL/stage.log"
    done
    mv "$FINAL/queue.txt" "$FINAL/gpu.txt"
    exit 0
fi
OUT=$FINAL/r
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | grep -v WARNING | tail -3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
# The stage's summary next to its logs, packed into one archive (more than a few files under $OUT get left out).
finish() {
    cp "$OUT/gpu.txt" "$FINAL/gpu.txt"; tar czf "$FINAL/results-$1.tgz" -C "$OUT" . && rm -rf "$OUT"; exit 0
}
if [ "$STAGE" = fit ]; then
    for sec in sweep decode; do   # separately (a run stopped by its timeout still writes the rows it timed)
        timeout $([ $sec = sweep ] && echo 360 || echo 180) python3 benchmarks/kernel_check.py --$sec ${AFTER:+--after} \
            --out "$OUT/$sec" \
            > "$OUT/$sec.log" 2>&1
        echo "$sec rc $? $(grep -c ' us (eager' "$OUT/$sec.log") timed plans" | tee -a "$OUT/gpu.txt"
    done
    timeout 60 python3 benchmarks/fit_stream.py "$OUT"/sweep/kernel_check.json "$OUT"/decode/kernel_check.json \
        ${AFTER:+--after} --json "$OUT/fit.json" > "$OUT/fit.log" 2>&1
    echo "fit_stream rc $?" | tee -a "$OUT/gpu.txt"; head -8 "$OUT/fit.log" >> "$OUT/gpu.txt"
    finish fit
fi
if [ "$STAGE" = epilogue ]; then
    ONE=gpt2:2048:bm=128,bn=256,bl=128,s1=1,s2=1
    python3 benchmarks/kernel_check.py --one $ONE > "$OUT/warm.log" 2>&1   # compile outside the profiler
    timeout 400 ncu --clock-control none --set full --import-source yes -k regex:fuser_ffn -c 1 \
        --export "$OUT/epilogue" python3 benchmarks/kernel_check.py --one $ONE > "$OUT/ncu.log" 2>&1
    echo "ncu rc $?" | tee -a "$OUT/gpu.txt"
    ncu --import "$OUT/epilogue.ncu-rep" --page source --csv --print-source sass > "$OUT/epilogue-sass.csv" 2>&1 ||
        ncu --import "$OUT/epilogue.ncu-rep" --page raw --csv > "$OUT/epilogue-raw.csv" 2>&1
    ncu --import "$OUT/epilogue.ncu-rep" --page details > "$OUT/epilogue-details.txt" 2>&1
    echo "exports rc $? $(wc -l < "$OUT/epilogue-details.txt") detail lines" | tee -a "$OUT/gpu.txt"
    finish epilogue
fi
if [ "$STAGE" = trace ]; then
    for set in decode prefill; do
        timeout 150 python3 benchmarks/kernel_check.py --trace $set --out "$OUT/trace-$set" > "$OUT/trace-$set.log" 2>&1
        echo "trace $set rc $?" | tee -a "$OUT/gpu.txt"; grep -E '^trace' "$OUT/trace-$set.log" | cut -c1-300 >> "$OUT/gpu.txt"
    done
    finish trace
fi
if [ "$STAGE" = eager ]; then
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_packed.py tests/test_eager_epilogue.py \
        tests/test_gate.py tests/test_fast_route.py tests/test_exchange.py 2>&1 | tail -30 > "$OUT/pytest_eager.log"
    echo "pytest eager rc ${PIPESTATUS[0]} $(grep -E '(passed|failed|error)' "$OUT/pytest_eager.log" | tail -1)" \
        | tee -a "$OUT/gpu.txt"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 --kernel-name regex=fuser_gate \
        python3 tests/gpu/sanitize_gate.py > "$OUT/sanitizer_gate.txt" 2>&1
    echo "memcheck gate rc $? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_gate.txt" | head -1)" | tee -a "$OUT/gpu.txt"
    for b in eager_gate eager_epilogue; do
        timeout 120 python3 benchmarks/$b.py --compile --json "$OUT/$b.json" > "$OUT/$b.log" 2>&1
        echo "$b rc $?" | tee -a "$OUT/gpu.txt"; tail -24 "$OUT/$b.log" >> "$OUT/gpu.txt"
    done
    # the FP8 picks at 576 tokens (rowwise GEMMs priced in whole 128-token tiles) beside PyTorch's FP8 ops
    timeout 90 python3 benchmarks/fp8_decode.py --models gpt3-6.7b,llama-70b --tokens 576 --json "$OUT/fp8-576.json" \
        > "$OUT/fp8-576.log" 2>&1
    echo "fp8_decode 576 rc $?" | tee -a "$OUT/gpu.txt"; tail -8 "$OUT/fp8-576.log" >> "$OUT/gpu.txt"
    finish eager
fi
if [ "$STAGE" = zerobias ]; then
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_eager_epilogue.py tests/test_eager_out.py \
        tests/test_host_bound.py 2>&1 | tail -30 > "$OUT/pytest_zero_bias.log"
    echo "pytest zero bias rc ${PIPESTATUS[0]} $(grep -E '(passed|failed|error)' "$OUT/pytest_zero_bias.log" | tail -1)" \
        | tee -a "$OUT/gpu.txt"
    for run in a b; do
        timeout 150 python3 benchmarks/eager_epilogue.py --zero-bias --json "$OUT/zero-bias-$run.json" \
            > "$OUT/zero-bias-$run.log" 2>&1
        echo "eager_epilogue --zero-bias $run rc $?" | tee -a "$OUT/gpu.txt"; tail -14 "$OUT/zero-bias-$run.log" >> "$OUT/gpu.txt"
    done
    finish zerobias
fi
# Run 'a' and run 'b' of one pick_diff.py command (its output file as OUTPUT in the arguments) under a timeout:
# each run's log beside its JSON, the lines matching PATTERN into the summary.
#     twice NAME SECONDS PATTERN ARGS...
twice() {
    local name=$1 secs=$2 pattern=$3; shift 3
    for run in a b; do
        timeout "$secs" python3 benchmarks/pick_diff.py "${@/OUTPUT/$OUT/$name-$run.json}" > "$OUT/$name-$run.log" 2>&1
        echo "$name $run rc $?" | tee -a "$OUT/gpu.txt"; grep -E "$pattern" "$OUT/$name-$run.log" | cut -c1-280 >> "$OUT/gpu.txt"
    done
}
if [ "$STAGE" = cells ]; then
    for cells in $LISTS; do
        twice "$(basename "$cells" -cells.json)" 140 ' eager |slower|loses' time --route "$cells" OUTPUT
    done
    finish "cells${CELLS:+-$CELLS}"
fi
if [ "$STAGE" = plans ]; then
    for list in $LISTS; do
        twice "$(basename "$list" -plans.txt)" 200 ' us \(eager|Error|^trace: span' plans ${TRACE:+--trace} \
            ${LAYOUTS:+--layouts} ${WARM:+--warm} ${EXACT:+--exact} ${LEADS:+--leads $LEADS} ${AGAIN:+--again} ${AFTER:+--after} OUTPUT \
            $(grep -v '^#' "$list")
        if [ -n "${AGAIN:-}" ]; then   # each setting against the null of both runs
            name=$(basename "$list" -plans.txt)
            python3 benchmarks/pick_diff.py ab "$OUT/$name-a.json" "$OUT/$name-b.json" > "$OUT/$name-ab.log" 2>&1
            echo "$name ab rc $?" | tee -a "$OUT/gpu.txt"; grep -E "over the main graph|error" "$OUT/$name-ab.log" \
                | cut -c1-600 >> "$OUT/gpu.txt"
        fi
    done
    finish "plans${PLANS:+-$PLANS}"
fi
# compute-sanitizer's three tools on one workload, each under a timeout: its report beside the summary's line.
#     sanitizers NAME KERNEL_REGEX SCRIPT
sanitizers() {
    for tool in memcheck racecheck synccheck; do
        timeout 90 compute-sanitizer --tool $tool --error-exitcode 3 --kernel-name regex="$2" python3 "$3" \
            > "$OUT/sanitizer_$1_$tool.txt" 2>&1
        echo "sanitizer $1 $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$1_$tool.txt" \
            | head -1)" | tee -a "$OUT/gpu.txt"
    done
}
if [ "$STAGE" = sanitize ]; then
    sanitizers stream fuser_ffn tests/gpu/sanitize_stream.py
    sanitizers gate fuser_gate tests/gpu/sanitize_gate.py
    finish sanitize
fi
if [ "$STAGE" = graphs ]; then
    timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_benchmarks.py -k graph_calls 2>&1 \
        | tail -20 > "$OUT/pytest_graphs.log"
    echo "pytest graph_calls rc ${PIPESTATUS[0]} $(grep -E '(passed|failed|error)' "$OUT/pytest_graphs.log" | tail -1)" \
        | tee -a "$OUT/gpu.txt"
    timeout 150 python3 benchmarks/graph_calls.py --after-op --json "$OUT/graph-calls.json" > "$OUT/graph-calls.log" 2>&1
    echo "graph_calls rc $?" | tee -a "$OUT/gpu.txt"; cut -c1-240 "$OUT/graph-calls.log" >> "$OUT/gpu.txt"
    finish graphs
fi
if [ "$STAGE" = host ]; then
    timeout 480 python3 benchmarks/host_overhead.py --set quick --clock thread --rounds ${ROUNDS:-31} --pieces \
        --json "$OUT/host.json" > "$OUT/host.log" 2>&1
    echo "host_overhead rc $?" | tee -a "$OUT/gpu.txt"; grep -E "target|==" "$OUT/host.log" | cut -c1-200 >> "$OUT/gpu.txt"
    finish host
fi
if [ "$STAGE" = targets ]; then
    RUN=${RUN:-a}
    timeout 540 python3 -m fuser bench --set targets --autotune none --no-host --out "$OUT/targets-$RUN" \
        ${GRAPH_CALLS:+--graph-calls "$GRAPH_CALLS"} ${GRAPH_AFTER:+--graph-after "$GRAPH_AFTER"} \
        > "$OUT/targets-$RUN.log" 2>&1
    echo "targets $RUN rc $?" | tee -a "$OUT/gpu.txt"
    python3 -m fuser bench --score "$OUT/targets-$RUN/results.csv" 2>&1 | head -16 >> "$OUT/gpu.txt"
    finish "targets-$RUN"
fi
# The stream kernel's checks: a smoke run of the sanitizer workload (the rest is skipped if it fails or
# hangs), the stream GPU tests, memcheck on the workload. Returns the smoke run's status.
stream_checks() {
    timeout 60 python3 tests/gpu/sanitize_stream.py > "$OUT/smoke.log" 2>&1
    local rc=$?
    echo "smoke rc $rc" | tee -a "$OUT/gpu.txt"; cat "$OUT/smoke.log" >> "$OUT/gpu.txt"
    [ $rc = 0 ] || return $rc
    timeout 240 python3 -m pytest tests/test_gpu_stream.py -q -p no:cacheprovider -x --durations=5 2>&1 | tail -30 \
        > "$OUT/pytest_stream.log"
    echo "pytest stream rc ${PIPESTATUS[0]} $(grep -E '(passed|failed|error)' "$OUT/pytest_stream.log" | tail -1)" \
        | tee -a "$OUT/gpu.txt"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 --kernel-name regex=fuser_ffn \
        python3 tests/gpu/sanitize_stream.py > "$OUT/sanitizer_memcheck.txt" 2>&1
    echo "memcheck rc $? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_memcheck.txt" | head -1)" | tee -a "$OUT/gpu.txt"
}
# `kernel_check.py --SECTION` into $OUT/NAME, its timing and trace lines into the summary.
kernel_section() {
    timeout "$3" python3 benchmarks/kernel_check.py --"$1" --out "$OUT/$2" > "$OUT/$2.log" 2>&1
    echo "$2 rc $?" | tee -a "$OUT/gpu.txt"
    grep -E ' us \(eager|^trace .*span|^trace .*phase 2:' "$OUT/$2.log" | cut -c1-240 >> "$OUT/gpu.txt"
}
if [ "$STAGE" = pairs ]; then
    timeout 60 python3 benchmarks/kernel_check.py --gemm --out "$OUT/gemm" > "$OUT/gemm.log" 2>&1
    echo "gemm rc $?" | tee -a "$OUT/gpu.txt"; grep -E "\^3|variant|x torch" "$OUT/gemm.log" | head -12 >> "$OUT/gpu.txt"
    stream_checks && kernel_section pairs pairs 200
    finish pairs
fi
if [ "$STAGE" = onephase ]; then
    stream_checks && kernel_section one-phase onephase 150
    finish onephase
fi
if [ "$STAGE" = prefill ]; then
    stream_checks
    timeout 240 python3 benchmarks/kernel_check.py --prefill --out "$OUT/prefill" > "$OUT/prefill.log" 2>&1
    echo "prefill rc $?" | tee -a "$OUT/gpu.txt"; grep -E ' us \(eager' "$OUT/prefill.log" | cut -c1-200 >> "$OUT/gpu.txt"
    timeout 60 python3 benchmarks/kernel_check.py --trace prefill --out "$OUT/trace" > "$OUT/trace.log" 2>&1
    echo "trace rc $?" | tee -a "$OUT/gpu.txt"; grep -E '^trace' "$OUT/trace.log" | cut -c1-300 >> "$OUT/gpu.txt"
    finish prefill
fi
if [ "$STAGE" != bench ]; then
    # the cluster kernel's correctness matrix (minutes) only with FULL=1
    SKIP=$([ "${FULL:-0}" = 1 ] || echo "--deselect tests/test_gpu_kernels.py::test_correctness_matrix")
    FUSER_GPU_STREAM_REPORT=$OUT/stream_matrix.json timeout 400 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        --durations=15 $SKIP 2>&1 | tail -45 > "$OUT/pytest_gpu.log"
    echo "pytest -m gpu rc ${PIPESTATUS[0]} $(grep -E '(passed|failed|error|skipped)' "$OUT/pytest_gpu.log" | tail -1)" \
        | tee -a "$OUT/gpu.txt"
    # the host harness in what is left of a 10-minute call (at least 90 s): ROUNDS (15) rounds on the thread clock
    left=$((570 - SECONDS)); left=$((left < 90 ? 90 : left))
    timeout $left python3 benchmarks/host_overhead.py --set quick --clock thread --rounds ${ROUNDS:-15} --pieces \
        --json "$OUT/host.json" > "$OUT/host.log" 2>&1
    echo "host_overhead rc $? (${ROUNDS:-15} rounds, thread clock)" | tee -a "$OUT/gpu.txt"
    grep -E "target|==" "$OUT/host.log" | cut -c1-260 >> "$OUT/gpu.txt"
fi
if [ "$STAGE" = check ]; then
    finish check
fi
sanitizers stream fuser_ffn tests/gpu/sanitize_stream.py
DECODE=llama2-7b:1,llama3-8b:1,llama3-8b:16,llama3-8b:64,llama3-8b:128,llama-70b:16,gpt3-6.7b:16,gpt2:1,gpt2:16
# GEMM=0 leaves the probe out, DECODE_RUNS=1 the second decode run (to fit a call with other work)
if [ "${GEMM:-1}" != 0 ]; then
    timeout 60 python3 benchmarks/kernel_check.py --gemm --out "$OUT/gemm" > "$OUT/gemm.log" 2>&1
fi
timeout 120 python3 benchmarks/kernel_check.py --bench paper --out "$OUT/paper" > "$OUT/paper.log" 2>&1
for i in $(seq "${DECODE_RUNS:-2}"); do
    timeout 100 python3 benchmarks/kernel_check.py --bench $DECODE --out "$OUT/decode$i" > "$OUT/decode$i.log" 2>&1
done
{ grep -sE "8192\^3" "$OUT/gemm.log"; grep -hE "^[A-Za-z0-9.-]+ +M=[0-9]+ +floor +[0-9.]+ +eager" "$OUT"/paper.log \
    "$OUT"/decode*.log | cut -c1-170; } | tee -a "$OUT/gpu.txt"
finish bench
