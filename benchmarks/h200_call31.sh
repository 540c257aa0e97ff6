# Device call 31 (nvidia-h200; session 7): the rank-based sampler's re-sort + draw served by cached graphs
#   1. every GPU test (one GPU); 2. replay.py ours at 1e6 (rank rows beside the proportional ones, one run)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w31; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short --deselect tests/test_ddp_gpu.py \
  > $W/gpu_tests_all.log 2>&1; pack
cd benchmarks
timeout 150 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
tail -n 6 $W/gpu_tests_all.log; cat $W/r/replay_ours.md
