#!/usr/bin/env bash
# Every CUDA path of the project in one short run on a GPU machine: the attention types' CUDA paths
# (FlexAttention, SDPA, the linear family; fp32 and bf16, forward and gradients, both forms), supernet
# training with bf16 autocast (eager and --compile), latency on cuda (eager,
# cudagraph, compile), a predictor and a search scoring on the GPU, one subnet trained on the GPU, and
# the attention benchmark on cuda. Each step has its own time limit; a failing step does not stop the
# others. The CPU suite never needs a GPU; this is the check for the code it cannot reach.
#
#   scripts/gpu_check_all.sh [OUTDIR [WORKDIR]]   # logs and results in OUTDIR (default runs/gpu_check),
#                                                 # the runs' checkpoints and tables in WORKDIR (default OUTDIR/work)
#   GPU_CHECK_SECONDS=500 scripts/gpu_check_all.sh   # the whole run's time: a step gets at most what is left,
#                                                    # and the steps are in order of what matters most
#   GPU_CHECK_STEPS=train-bf16,latency-eager scripts/gpu_check_all.sh   # only these steps (names as in summary.txt)
#   GPU_CHECK_SAMPLES=40 scripts/gpu_check_all.sh   # subnets in the eager and cudagraph campaigns (default 16),
#                                                   # each fitted to a predictor (its held-out error vs test-retest)
#
# OUTDIR holds all.log (every step's output), summary.txt (each step's exit code and seconds),
# gpu_check_attention.json, bench_attention_cuda.{csv,json,png}, the eager latency table and the search's result.
set -u
out="${1:-runs/gpu_check}"
run_dir="${2:-$out/work}"
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-1200}))
mkdir -p "$out"
export PYTHONUNBUFFERED=1
summary="$out/summary.txt"
: >"$summary"
all="$out/all.log"
: >"$all"

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to all.log, one summary line
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS left=$((deadline - SECONDS))
    case ",${GPU_CHECK_STEPS:-$name}," in *",$name,"*) ;; *) return ;; esac
    if [ "$left" -lt 15 ]; then
        printf '%-28s skipped: no time left in the run\n' "$name" | tee -a "$summary" "$all"
        return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "===== $name (limit ${limit}s): $*" | tee -a "$all"
    timeout --kill-after=10 "$limit" "$@" >>"$all" 2>&1
    local rc=$?
    printf '%-28s rc=%-4s %5ss\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$summary" "$all"
}

rm -rf "$run_dir"
mkdir -p "$run_dir"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
} 2>&1 | tee -a "$all"

step attention-parity 200 python3 scripts/gpu_check_attention.py --lengths 1000 --dtypes fp32,bf16 \
    --bench-lengths "" --out "$out/gpu_check_attention.json"

step runtimes-per-type 150 python3 scripts/gpu_check_runtimes.py --space tiny --runtimes cudagraph,compile --jobs 4
step runtimes-encoder 120 python3 scripts/gpu_check_runtimes.py --space encoder-tiny --runtimes cudagraph,compile --jobs 4

sn="$run_dir/supernet"
step train-bf16 90 nas train-supernet tiny --out "$sn" --device cuda --max-steps 30 --eval-interval 15 \
    --ckpt-interval 15 --eval-batches 4 --seed 0
lat="$run_dir/lat-eager.csv"
samples=${GPU_CHECK_SAMPLES:-16}
step latency-eager 200 nas measure-latency -q tiny --device cuda --samples "$samples" --rounds 2 --repeats 6 --out "$lat"
step fit-predictor 60 nas fit-predictor "$lat" --out "$run_dir/pred"
# the budget: the median measured latency of the table (a search that must choose)
budget=$(python3 -c "import csv, statistics, sys; rows = [float(r['median_ms']) for r in csv.DictReader(open(sys.argv[1])) if r['pass'] == 'measure']; print(f'{statistics.median(rows):.4f}ms')" "$lat" 2>>"$all")
echo "budget: ${budget:-none}" | tee -a "$all"
step search-cuda 120 nas search "$sn/latest.pt" --predictor "$run_dir/pred" --budget "${budget:-1ms}" --device cuda \
    --population 16 --parents 8 --generations 3 --no-progress --out "$run_dir/search"
best=$(ls "$run_dir"/search/best_*.yaml 2>/dev/null | head -n 1)
step train-subnet-cuda 90 nas train-subnet "${best:-missing-best.yaml}" --space tiny --out "$run_dir/subnet" \
    --device cuda --max-steps 20 --eval-interval 20 --eval-batches 4
step latency-cudagraph 150 nas measure-latency -q tiny --device cuda --runtime cudagraph --samples "$samples" --rounds 2 \
    --repeats 6 --out "$run_dir/lat-graph.csv"
step fit-predictor-cudagraph 60 nas fit-predictor "$run_dir/lat-graph.csv" --out "$run_dir/pred-graph"
step latency-compile 120 nas measure-latency -q tiny --device cuda --runtime compile --samples 3 --rounds 2 \
    --repeats 4 --out "$run_dir/lat-compile.csv"
step train-compile 150 nas train-supernet tiny --out "$run_dir/compiled" --device cuda --max-steps 20 \
    --eval-interval 20 --ckpt-interval 20 --eval-batches 4 --seed 0 --compile
step bench-attention-cuda 120 python3 scripts/bench_attention.py --devices cuda --lengths 16384 \
    --types softmax,local:64,strided:64,linear --modes fwd,fwdbwd --scopes attention --dtype bf16 \
    --out "$out/bench_attention_cuda"

cp "$lat" "$out/latency_cuda_eager.csv" 2>/dev/null
cp "$run_dir/lat-graph.csv" "$out/latency_cuda_cudagraph.csv" 2>/dev/null
cp "$run_dir/search/search.json" "$out/search_cuda.json" 2>/dev/null
echo "===== summary" | tee -a "$all"
cat "$summary"
