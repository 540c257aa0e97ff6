# Device call 37 (nvidia-h200; session 8): search totals and block sums as tree sums (no scan in the write),
# one packed count reduction in the write; replay.py -sample-update rows; DQN updates/s (main job)
#   1. every GPU test (one GPU); 2. replay.py ours at 1e6 and 1e7 + TorchRL at 1e6 (merged);
#   3. kernel profiles at 1e6 and 1e7; 4. the host floor under the eager step (host_floor.py)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w37; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 220 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short --deselect tests/test_ddp_gpu.py \
  > $W/gpu_tests_all.log 2>&1; pack
cd benchmarks
timeout 200 python3 replay.py --family ours --sizes 1e6,1e7 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 60 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
  --out $W/r/replay_torchrl.json > $W/replay_torchrl.log 2>&1; pack
python3 replay.py --merge $W/r/replay_ours.json $W/r/replay_torchrl.json --out $W/r/replay_merged.json > /dev/null 2>&1; pack
timeout 60 python3 profile_kernels.py --out $W/r/profile_kernels.txt > $W/profile_kernels.log 2>&1; pack
timeout 90 python3 profile_kernels.py --capacity 10000000 --out $W/r/profile_kernels_1e7.txt > $W/profile_kernels_1e7.log 2>&1; pack
timeout 60 python3 host_floor.py --cprofile --out $W/r/host_floor.json > $W/host_floor.log 2>&1; pack
timeout 150 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
tail -n 4 $W/gpu_tests_all.log; cat $W/r/replay_merged.md; grep -A8 "^== graph" $W/r/profile_kernels.txt $W/r/profile_kernels_1e7.txt
cat $W/host_floor.log | head -14
cat $W/r/dqn_ours.md
