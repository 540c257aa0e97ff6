# Device call 43 (nvidia-h200-x2; session 9): the final code on 2 GPUs: 1. the 2-GPU tests (DQN graph mode under
# DDP, the callbacks' once-per-epoch reduction, GA3C under DDP with NCCL: new case of tests/test_ga3c_ddp.py);
# 2. DDP scaling re-measured, the command of calls 11 and 17 (dqn.py --fit-only, Inductor, TF32, 8 updates per
# step and per graph), 2 GPUs then 1. $OUT/results.tgz after every stage.
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w43; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
LIGHTNING_PER_DUMP_AFTER_S=100 LIGHTNING_PER_DDP_TIMEOUT_S=150 timeout 300 python3 -m pytest -q -m gpu \
  tests/test_ddp_gpu.py tests/test_callbacks_ddp.py tests/test_ga3c_ddp.py -p no:cacheprovider --tb=short --durations=5 \
  > $W/gpu_tests_2gpu.log 2>&1; pack; tail -n 10 $W/gpu_tests_2gpu.log; grep -A15 "^____" $W/gpu_tests_2gpu.log | head -40
cd benchmarks
for N in 2 1; do timeout 110 python3 dqn.py --fit-only --fit-inductor --fit-tf32 --devices $N --updates-per-step 8 \
  --updates-per-graph 8 --out $W/fit${N}.json > $W/fit${N}.log 2>&1; pack; done
python3 dqn.py --scaling $W/fit1.json $W/fit2.json --out $W/scaling.json > /dev/null 2>&1; pack; cat $W/scaling.md
tail -n 3 $W/fit1.log $W/fit2.log
