# Device call 16 (nvidia-h200: one GPU, 16 cores, nothing else running; session 5). Sequential, so that the CPU-bound
# GA3C rows have the machine to themselves. $OUT/results.tgz after every stage.
#   1. CPU topology; GPU tests changed since call 15 (torch.compile test of the fused sample+gather, the sum-of-squares
#      clip, DQN module graph tests)
#   2. GA3C throughput: ale-bare (the emulator alone on all 16 cores) and ga3c-static (16 agents x 16 envs)
#   3. benchmarks/dqn.py ours with autotune (clip without torch's foreach norm)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
(lscpu; echo; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list; nproc) > $W/cpu.txt 2>&1
timeout 120 python3 -m pytest -q -m gpu tests/test_ext_kernels_gpu.py tests/test_dqn_inductor.py tests/test_dqn_module.py \
  tests/test_replay_gpu.py -p no:cacheprovider --tb=short > $W/gpu_tests.log 2>&1; pack
cd benchmarks
timeout 170 python3 ga3c.py --rows ale-bare,ga3c-static --seconds 30 --warmup 20 --out $W/r/ga3c_16x16.json > $W/ga3c.log 2>&1; pack
timeout 290 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
grep -E "Model name|^CPU\(s\)|Thread|Core|Socket" $W/cpu.txt; tail -n 2 $W/gpu_tests.log; cat $W/r/ga3c_16x16.md $W/r/dqn_ours.md 2>/dev/null
