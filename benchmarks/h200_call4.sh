# Device call 4 (two H200s): DQN/DDP GPU tests after the updates_per_step change, dqn-fit on 1 vs 2 GPUs
# (K = 1 and 8 updates per Lightning step), replay benchmark at N=1e6 (ours + TorchRL). $OUT/results.tgz
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; OUT=/tmp/w; mkdir -p $OUT/r; trap "tar czf $FINAL/results.tgz -C /tmp/w ." EXIT
timeout 150 python3 -m pytest -q -m gpu tests/test_dqn_module.py tests/test_ddp_gpu.py tests/test_callbacks_gpu.py tests/test_ext_kernels_gpu.py -p no:cacheprovider --timeout 140 --deselect "tests/test_ddp_gpu.py::test_two_gpu_graph_mode_fit_keeps_ranks_identical[uniform]" -W ignore::DeprecationWarning > $OUT/pytest_gpu.log 2>&1
tail -3 $OUT/pytest_gpu.log
cd benchmarks
for K in 1 8; do
  timeout 60 python3 dqn.py --fit-only --devices 1 --updates-per-step $K --out $OUT/r/fit1_k$K.json > $OUT/fit1_k$K.log 2>&1
  timeout 80 python3 dqn.py --fit-only --devices 2 --updates-per-step $K --out $OUT/r/fit2_k$K.json > $OUT/fit2_k$K.log 2>&1
  python3 dqn.py --scaling $OUT/r/fit1_k$K.json $OUT/r/fit2_k$K.json --out $OUT/scaling_k$K.json
done
export CUDA_VISIBLE_DEVICES=0
timeout 50 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $OUT/r/ours.json > $OUT/replay_ours.log 2>&1
PYTHONPATH=/tmp/anchor timeout 40 python3 replay.py --family torchrl --sizes 1e6 --batches 256 --out $OUT/r/trl.json > $OUT/replay_trl.log 2>&1
python3 replay.py --merge $OUT/r/ours.json $OUT/r/trl.json --out $OUT/replay.json > /dev/null
cat $OUT/scaling_k*.md $OUT/replay.md
