# Device call 11 (nvidia-h200-x2, session 4): (1) GPU tests of the changed DQN code on GPU 0 while the DQN
# update benchmark (with the max-autotune row) runs on GPU 1; (2) the 2-GPU CLI test with stack dumps;
# (3) dqn-fit on 1 and 2 GPUs with Inductor + TF32 and 8 updates per CUDA graph (the 1.8x goal).
# $OUT/results.tgz is rewritten after every stage.
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
(CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 timeout 200 python3 -m pytest -q -m gpu tests/test_dqn_module.py \
  tests/test_dqn_inductor.py -p no:cacheprovider > $W/gpu_tests.log 2>&1) &
(cd benchmarks && CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 timeout 200 python3 dqn.py --family ours --autotune \
  --no-fit --out $W/dqn_ours.json > $W/dqn_ours.log 2>&1) &
wait; pack; tail -3 $W/gpu_tests.log; cat $W/dqn_ours.md
LIGHTNING_PER_DUMP_AFTER_S=60 LIGHTNING_PER_DDP_TIMEOUT_S=140 timeout 150 python3 -m pytest -x -q \
  tests/test_ddp_gpu.py -k proportional --runxfail -p no:cacheprovider --tb=short > $W/ddp_gpu.log 2>&1; pack
tail -3 $W/ddp_gpu.log
cd benchmarks
for N in 1 2; do timeout 110 python3 dqn.py --fit-only --fit-inductor --fit-tf32 --devices $N --updates-per-step 8 \
  --updates-per-graph 8 --out $W/fit${N}.json > $W/fit${N}.log 2>&1; pack; done
python3 dqn.py --scaling $W/fit1.json $W/fit2.json --out $W/scaling.json; pack; cat $W/scaling.md
