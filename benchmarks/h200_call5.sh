# Device call 5 (two H200s): the 2-GPU DDP graph-mode test with its output, the replay/kernel GPU tests
# after the custom_op change, then GA3C Pong for the rest of the call (GA3C_S seconds). Logs straight to $OUT.
source benchmarks/h200_setup.sh || exit 1
timeout 130 python3 -m pytest -x -q tests/test_ddp_gpu.py -k proportional --timeout 120 -p no:cacheprovider --tb=short -W ignore::DeprecationWarning > $OUT/ddp_gpu.log 2>&1
tail -3 $OUT/ddp_gpu.log
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -q -m gpu tests/test_ext_kernels.py tests/test_ext_kernels_gpu.py tests/test_replay_gpu.py tests/test_envs_torch_cartpole.py -p no:cacheprovider --timeout 60 -rf -W ignore::DeprecationWarning > $OUT/pytest_gpu.log 2>&1
tail -3 $OUT/pytest_gpu.log
S=${GA3C_S:-170}
timeout $S python3 -m lightning_per.cli ga3c --config configs/ga3c_pong.yaml --max_time_s $((S - 25)) --run_dir /tmp/ga3c --status_interval_s 20 > $OUT/ga3c.log 2>&1
find /tmp/ga3c -name summary.json -exec cp {} $OUT/ga3c_summary.json \; ; find /tmp/ga3c -name learning_curve.png -exec cp {} $OUT/ga3c_curve.png \;
tail -8 $OUT/ga3c.log
