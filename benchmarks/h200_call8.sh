# Device call 8 (nvidia-h200-x2): first GPU run of the one-launch priority update + block prefix (ext/) and of
# DQN(inductor=True). Results in $OUT/results.tgz.
#   GPU 1: the GPU test suite (pytest -m gpu; the 2-GPU tests skip with one visible device)
#   GPU 0, alone, at the same time: replay_kernels.py (N = 1e6, 1e7), dqn.py (ours-eager / ours-graph /
#          ours-graph-inductor), profile_dqn.py (kernels per update, eager/inductor/graph)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; OUT=/tmp/w; mkdir -p $OUT/r; trap "tar czf $FINAL/results.tgz -C /tmp/w ." EXIT
(CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider --timeout 150 -rf --tb=short \
   -W ignore::DeprecationWarning > $OUT/pytest_gpu.log 2>&1) &
(export CUDA_VISIBLE_DEVICES=0; cd benchmarks
 timeout 60 python3 replay_kernels.py --sizes 1e6,1e7 --batches 256 --out $OUT/r/kernels.json > $OUT/replay_kernels.log 2>&1
 timeout 100 python3 dqn.py --family ours --no-fit --out $OUT/r/dqn_ours.json > $OUT/dqn_ours.log 2>&1
 timeout 60 python3 profile_dqn.py --graph --out $OUT/r/profile_dqn.json > $OUT/profile_dqn.txt 2>&1) &
wait
tail -4 $OUT/pytest_gpu.log; cat $OUT/replay_kernels.log | tail -25; tail -12 $OUT/dqn_ours.log; head -40 $OUT/profile_dqn.txt
