# Device call 9 (nvidia-h200-x2), the session's last: results in $OUT/results.tgz (re-packed after each stage).
#   GPU 1: GPU tests of what changed since call 8 (compiled Adam step + capture guard, index_select gather)
#   GPU 0, alone: replay_kernels.py and replay.py (ours + TorchRL 0.11.1) at N = 1e6 / 1e7 with the
#          16-steps-per-launch rows and the graph-launch floor, gather.py, dqn.py (ours + TorchRL)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -m gpu tests/test_dqn_inductor.py tests/test_dqn_module.py \
   tests/test_replay_gpu.py tests/test_ext_kernels_gpu.py tests/test_ext_kernels_fused.py -p no:cacheprovider --timeout 120 \
   -rf --tb=short -W ignore::DeprecationWarning > $W/pytest_gpu.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0
cd benchmarks
timeout 70 python3 replay_kernels.py --sizes 1e6,1e7 --batches 256 --out $W/r/kernels.json > $W/replay_kernels.log 2>&1; pack
timeout 60 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/ours.json > $W/replay_ours.log 2>&1
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 40 python3 replay.py --family torchrl --sizes 1e6 --batches 256 --out $W/r/trl.json > $W/replay_trl.log 2>&1
python3 replay.py --merge $W/r/ours.json $W/r/trl.json --out $W/replay.json > /dev/null 2>&1; pack
timeout 20 python3 gather.py --out $W/r/gather.json > $W/gather.log 2>&1
timeout 100 python3 dqn.py --family ours --no-fit --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 40 python3 dqn.py --family torchrl --no-fit --out $W/r/dqn_trl.json > $W/dqn_trl.log 2>&1
python3 dqn.py --merge $W/r/dqn_ours.json $W/r/dqn_trl.json --out $W/dqn.json > /dev/null 2>&1
wait; pack
tail -3 $W/pytest_gpu.log; tail -30 $W/replay_kernels.log; cat $W/replay.md; cat $W/gather.log; cat $W/dqn.md
