# Device call 7 (nvidia-h200-x2, 2 x H200, 32 cores), each side one GPU and 16 cores (taskset):
#   GPU 0, cores 0-15:  lightning-per ga3c --config configs/ga3c_pong.yaml (stops at mean20 >= 18),
#                       then the GPU test suite (pytest -m gpu) in the time left
#   GPU 1, cores 16-31: lightning-per fit --config configs/dqn_pong.yaml (env backend ale_vector), 8 minutes
# Outputs are copied to $OUT as soon as each job ends.
source benchmarks/h200_setup.sh || exit 1
(CUDA_VISIBLE_DEVICES=0 timeout 540 taskset -c 0-15 python3 -m lightning_per.cli ga3c --config configs/ga3c_pong.yaml \
   --max_time_s 500 --run_dir /tmp/ga3c --status_interval_s 30 > $OUT/ga3c_pong.log 2>&1; echo "ga3c rc=$?" >> $OUT/ga3c_pong.log
 find /tmp/ga3c -name summary.json -exec cp {} $OUT/ga3c_pong_summary.json \;
 find /tmp/ga3c -name learning_curve.png -exec cp {} $OUT/ga3c_pong_curve.png \;
 left=$((565 - SECONDS)); if [ $left -gt 60 ]; then CUDA_VISIBLE_DEVICES=0 timeout $left taskset -c 0-15 python3 -m pytest -q -m gpu \
   -p no:cacheprovider --tb=short tests > $OUT/gpu_tests.log 2>&1; fi) &
(CUDA_VISIBLE_DEVICES=1 timeout 555 taskset -c 16-31 python3 -m lightning_per.cli fit --config configs/dqn_pong.yaml \
   --trainer.max_time 00:00:08:00 --trainer.default_root_dir /tmp/dqn_pong --trainer.enable_progress_bar false \
   > $OUT/dqn_pong.log 2>&1; echo "dqn rc=$?" >> $OUT/dqn_pong.log
 cp /tmp/dqn_pong/summary.json $OUT/dqn_pong_summary.json; cp /tmp/dqn_pong/learning_curve.png $OUT/dqn_pong_curve.png) &
wait
tail -3 $OUT/ga3c_pong.log; grep -v Epoch $OUT/dqn_pong.log | tail -4; tail -3 $OUT/gpu_tests.log 2>/dev/null
