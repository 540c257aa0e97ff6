# Device call 29 (nvidia-h200; session 7): the closing evidence for the one-launch ticket write
#   1. every GPU test (one GPU); 2. replay.py ours at 1e6 and 1e7 + TorchRL at 1e6 (merged); kernel profile;
#   3. benchmarks/dqn.py ours, autotune, 8 updates per graph (pipelined), for the main job's updates/s
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w29; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short --deselect tests/test_ddp_gpu.py \
  > $W/gpu_tests_all.log 2>&1; pack
cd benchmarks
timeout 200 python3 replay.py --family ours --sizes 1e6,1e7 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 60 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
  --out $W/r/replay_torchrl.json > $W/replay_torchrl.log 2>&1; pack
python3 replay.py --merge $W/r/replay_ours.json $W/r/replay_torchrl.json --out $W/r/replay_merged.json > /dev/null 2>&1; pack
timeout 60 python3 profile_kernels.py --out $W/r/profile_kernels.txt > $W/profile_kernels.log 2>&1; pack
timeout 150 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
tail -n 4 $W/gpu_tests_all.log; cat $W/r/replay_merged.md; grep -A8 "^== graph" $W/r/profile_kernels.txt; cat $W/r/dqn_ours.md
