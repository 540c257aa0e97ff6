# Device call 3 (two H200s): GPU tests (incl. 2-GPU DDP), kernel + DQN benchmarks on GPU 0 while
# configs/dqn_cartpole_gpu.yaml trains on GPU 1, then the DDP scaling run (1 vs 2 GPUs). Results: $OUT/results.tgz
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; OUT=/tmp/w; mkdir -p $OUT/r; trap "tar czf $FINAL/results.tgz -C /tmp/w ." EXIT
nvidia-smi topo -m > $OUT/topo.txt 2>&1
timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --timeout 150 --deselect "tests/test_ddp_gpu.py::test_two_gpu_graph_mode_fit_keeps_ranks_identical[uniform]" -W ignore::DeprecationWarning > $OUT/pytest_gpu.log 2>&1
tail -4 $OUT/pytest_gpu.log
CUDA_VISIBLE_DEVICES=1 timeout 170 python3 -m lightning_per.cli fit --config configs/dqn_cartpole_gpu.yaml \
  --trainer.max_time 00:00:02:30 --trainer.default_root_dir $OUT/fit > $OUT/fit.log 2>&1 &
FIT=$!
cd benchmarks
export CUDA_VISIBLE_DEVICES=0
timeout 60 python3 replay_kernels.py --sizes 1e6,1e7 --batches 256 --out $OUT/r/kernels.json > $OUT/kernels.log 2>&1
timeout 100 python3 dqn.py --family ours --out $OUT/r/dqn_ours.json > $OUT/dqn_ours.log 2>&1
wait $FIT; unset CUDA_VISIBLE_DEVICES
timeout 70 python3 dqn.py --fit-only --devices 1 --out $OUT/r/ddp1.json > $OUT/ddp1.log 2>&1
timeout 90 python3 dqn.py --fit-only --devices 2 --out $OUT/r/ddp2.json > $OUT/ddp2.log 2>&1
python3 dqn.py --scaling $OUT/r/ddp1.json $OUT/r/ddp2.json --out $OUT/scaling.json
tail -3 $OUT/fit.log; tail -12 $OUT/kernels.log $OUT/dqn_ours.log $OUT/ddp2.log
