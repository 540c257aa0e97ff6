# Device call 8 (nvidia-h200-x2): the session's last call; results in $OUT/results.tgz.
#   phase 1, side by side: GPU tests on GPU 0 (kernels, replay, inductor, DQN module, callbacks) and the
#            2-GPU CLI test with checkpoints (tests/test_ddp_gpu.py, stack dump of a hung rank)
#   phase 2, GPU 0 alone: replay benchmark (ours + TorchRL 0.11.1, N = 1e6 and 1e7), DQN benchmark
#            (ours-eager / ours-graph / ours-graph-inductor + TorchRL), kernels per DQN update
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; OUT=/tmp/w; mkdir -p $OUT/r; trap "tar czf $FINAL/results.tgz -C /tmp/w ." EXIT
(CUDA_VISIBLE_DEVICES=0 timeout 160 python3 -m pytest -q -m gpu tests -p no:cacheprovider --timeout 140 -rf --tb=short \
   -W ignore::DeprecationWarning > $OUT/pytest_gpu.log 2>&1) &
(timeout 150 python3 -m pytest -x -q tests/test_ddp_gpu.py -k proportional --runxfail --timeout 145 -p no:cacheprovider \
   --tb=short > $OUT/ddp_gpu.log 2>&1) &
wait
tail -4 $OUT/pytest_gpu.log; tail -4 $OUT/ddp_gpu.log
export CUDA_VISIBLE_DEVICES=0
cd benchmarks
timeout 90 python3 replay.py --family ours --sizes 1e6,1e7 --batches 256 --out $OUT/r/ours.json > $OUT/replay_ours.log 2>&1
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 50 python3 replay.py --family torchrl --sizes 1e6,1e7 --batches 256 --out $OUT/r/trl.json > $OUT/replay_trl.log 2>&1
python3 replay.py --merge $OUT/r/ours.json $OUT/r/trl.json --out $OUT/replay.json > /dev/null 2>&1; cat $OUT/replay.md
timeout 120 python3 dqn.py --family ours --no-fit --out $OUT/r/dqn_ours.json > $OUT/dqn_ours.log 2>&1
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 40 python3 dqn.py --family torchrl --no-fit --out $OUT/r/dqn_trl.json > $OUT/dqn_trl.log 2>&1
tail -12 $OUT/dqn_ours.log; tail -3 $OUT/dqn_trl.log
left=$((555 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 profile_dqn.py --graph --out $OUT/profile_dqn.json > $OUT/profile_dqn.txt 2>&1
head -30 $OUT/profile_dqn.txt
