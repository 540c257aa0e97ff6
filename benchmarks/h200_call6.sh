# Device call 6 (nvidia-h200-x2, 2 x H200, 32 cores): the two Pong runs side by side, each with one GPU
# and 16 cores (taskset), for 8.5 minutes of training each:
#   GPU 0, cores 0-15:  lightning-per ga3c --config configs/ga3c_pong.yaml
#   GPU 1, cores 16-31: lightning-per fit --config configs/dqn_pong.yaml
# If the DQN run stops early, the GPU test suite runs on its GPU instead. Outputs -> $OUT.
source benchmarks/h200_setup.sh || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt; nproc >> $OUT/gpus.txt
(CUDA_VISIBLE_DEVICES=0 timeout 570 taskset -c 0-15 python3 -m lightning_per.cli ga3c --config configs/ga3c_pong.yaml \
   --max_time_s 510 --run_dir /tmp/ga3c --status_interval_s 30 > $OUT/ga3c_pong.log 2>&1; echo "ga3c rc=$?" >> $OUT/ga3c_pong.log) &
(CUDA_VISIBLE_DEVICES=1 timeout 570 taskset -c 16-31 python3 -m lightning_per.cli fit --config configs/dqn_pong.yaml \
   --trainer.max_time 00:00:08:30 --trainer.default_root_dir /tmp/dqn_pong --trainer.enable_progress_bar false \
   > $OUT/dqn_pong.log 2>&1; rc=$?; echo "dqn rc=$rc" >> $OUT/dqn_pong.log
 if [ $rc -ne 0 ]; then CUDA_VISIBLE_DEVICES=1 timeout 300 taskset -c 16-31 python3 -m pytest -q -m gpu -p no:cacheprovider \
   --tb=short tests > $OUT/gpu_tests.log 2>&1; fi) &
wait
find /tmp/ga3c -name summary.json -exec cp {} $OUT/ga3c_pong_summary.json \;
find /tmp/ga3c -name learning_curve.png -exec cp {} $OUT/ga3c_pong_curve.png \;
cp /tmp/dqn_pong/summary.json $OUT/dqn_pong_summary.json; cp /tmp/dqn_pong/learning_curve.png $OUT/dqn_pong_curve.png
tail -4 $OUT/ga3c_pong.log; grep -v Epoch $OUT/dqn_pong.log | tail -6; tail -3 $OUT/gpu_tests.log 2>/dev/null
