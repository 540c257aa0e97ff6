# Device call 15 (nvidia-h200-x2, session 5). $OUT/results.tgz after every stage.
#   GPU 1, cores 16-31: the whole GPU test suite (pytest -m gpu: fused sample+gather kernel, clip inside the
#                       compiled Adam step, host-overhead cuts); benchmarks/dqn.py ours (autotune, 8 and 32
#                       updates per graph, separate-clip comparison row)
#   GPU 0, cores 0-15:  GA3C throughput: ale-bare + ga3c-static with 16 agents x 16 envs, then 32 agents x 8 envs
#                       (CPU cores used by the learner and by the agents); replay.py at N = 1e6 (ours, TorchRL);
#                       dqn.py TorchRL row; the replay tests against torchrl 0.11.1 + tensordict 0.11 (the oldest
#                       we support); profile_dqn.py (kernels per update of the graph-inductor update)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
(export CUDA_VISIBLE_DEVICES=1
 timeout 150 taskset -c 16-31 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short > $W/gpu_tests.log 2>&1; pack
 cd benchmarks
 timeout 330 taskset -c 16-31 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 32 --out $W/r/dqn_ours.json \
   > $W/dqn_ours.log 2>&1; pack) &
(export CUDA_VISIBLE_DEVICES=0; cd benchmarks
 timeout 150 taskset -c 0-15 python3 ga3c.py --rows ale-bare,ga3c-static --seconds 40 --warmup 20 --out $W/r/ga3c_16x16.json \
   > $W/ga3c.log 2>&1; pack
 timeout 110 taskset -c 0-15 python3 ga3c.py --rows ga3c-static --agents 32 --envs-per-agent 8 --seconds 40 --warmup 20 \
   --out $W/r/ga3c_32x8.json >> $W/ga3c.log 2>&1; pack
 timeout 70 taskset -c 0-15 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/rp_ours.json > $W/replay_ours.log 2>&1
 PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 30 taskset -c 0-15 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
   --out $W/r/rp_trl.json > $W/replay_trl.log 2>&1
 python3 replay.py --merge $W/r/rp_ours.json $W/r/rp_trl.json --out $W/replay.json > /dev/null 2>&1; pack
 PYTHONPATH=/tmp/anchor timeout 40 taskset -c 0-15 python3 dqn.py --family torchrl --no-fit --iters 300 \
   --out $W/r/dqn_trl.json > $W/dqn_trl.log 2>&1; pack
 (cd .. && PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 120 taskset -c 0-15 python3 -m pytest -q tests/test_replay_contract.py \
   tests/test_replay_direct_paths.py tests/test_replay_gather.py -p no:cacheprovider --tb=short > $W/replay_tests_torchrl011.log 2>&1); pack
 timeout 60 taskset -c 0-15 python3 profile_dqn.py --graph --modes graph-inductor --tf32 --out $W/profile_dqn.json \
   > $W/profile_dqn.log 2>&1; pack) &
wait
(cd benchmarks && python3 dqn.py --merge $W/r/dqn_ours.json $W/r/dqn_trl.json --out $W/dqn.json > /dev/null 2>&1); pack
tail -n 3 $W/gpu_tests.log $W/replay_tests_torchrl011.log; cat $W/dqn.md $W/replay.md 2>/dev/null; grep "^|" $W/r/ga3c_*.md 2>/dev/null; tail -n 30 $W/profile_dqn.log
