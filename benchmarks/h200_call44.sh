# Device call 44 (nvidia-h200-x2; session 9): call 43 measured DDP scaling at 1.12x (session 5: 1.73x). Is it the
# replay's second stream (DQN(overlap_replay=...), new) or noise? 1. the graph-vs-eager DQN GPU tests (both
# overlap_replay cases); 2. dqn-fit on 2 GPUs and on 1, each with the second stream (default) and without
# (--fit-serial-replay), same command as calls 11, 17 and 43 otherwise; scaling tables for both.
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w44; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 150 python3 -m pytest -q -m gpu tests/test_dqn_module.py -p no:cacheprovider --tb=short > $W/gpu_tests_dqn.log 2>&1
pack; tail -n 2 $W/gpu_tests_dqn.log; grep -A15 "^____" $W/gpu_tests_dqn.log | head -30
cd benchmarks
for V in serial default; do
  X=""; [ $V = serial ] && X="--fit-serial-replay"
  for N in 2 1; do timeout 110 python3 dqn.py --fit-only --fit-inductor --fit-tf32 --devices $N --updates-per-step 8 \
    --updates-per-graph 8 $X --out $W/fit${N}_$V.json > $W/fit${N}_$V.log 2>&1; pack; done
  python3 dqn.py --scaling $W/fit1_$V.json $W/fit2_$V.json --out $W/scaling_$V.json > /dev/null 2>&1; pack
  echo "== $V"; cat $W/scaling_$V.md
done
