# Device call 17 (nvidia-h200-x2, session 5, the last ~5 minutes of device time): DDP scaling re-measured with the current
# code (gradients zeroed between the updates of one graph, fused sample + gather, clip inside the compiled Adam step),
# then the 2-GPU CLI tests if time is left. $OUT/results.tgz after every stage.
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
cd benchmarks
for N in 2 1; do timeout 100 python3 dqn.py --fit-only --fit-inductor --fit-tf32 --devices $N --updates-per-step 8 \
  --updates-per-graph 8 --out $W/fit${N}.json > $W/fit${N}.log 2>&1; pack; done
python3 dqn.py --scaling $W/fit1.json $W/fit2.json --out $W/scaling.json > /dev/null 2>&1; pack; cat $W/scaling.md
cd ..
LIGHTNING_PER_DUMP_AFTER_S=60 LIGHTNING_PER_DDP_TIMEOUT_S=100 timeout 100 python3 -m pytest -x -q tests/test_ddp_gpu.py \
  -p no:cacheprovider --tb=short > $W/ddp_gpu.log 2>&1; pack; tail -n 2 $W/ddp_gpu.log
