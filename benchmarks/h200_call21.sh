# Device call 21 (nvidia-h200: one GPU, 16 cores, alone; session 6): GA3C graph mode.
#   1. GPU tests: GA3C graph mode (new), DQN module (pipelined graph body), replay gather
#   2. learner alone, eager vs graph (batch 160 x 4x84x84), then with 2 predictor threads at 18k PPS
#   3. full Pong rows: ga3c-static eager vs ga3c-static-graph (16 agents x 16 envs, 2 predictors, 2 trainers)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 150 python3 -m pytest -q -m gpu tests/test_ga3c_graph.py tests/test_dqn_module.py tests/test_replay_gather.py \
  -p no:cacheprovider --tb=short > $W/gpu_tests.log 2>&1; pack
cd benchmarks
timeout 60 python3 ga3c.py --learner-only --out $W/r > $W/learner_eager.log 2>&1; pack
timeout 60 python3 ga3c.py --learner-only --cuda-graph --out $W/r > $W/learner_graph.log 2>&1; pack
timeout 60 python3 ga3c.py --learner-only --cuda-graph --synthetic-pps 18000 --predictors 2 --out $W/r \
  > $W/learner_graph_pps.log 2>&1; pack
timeout 95 python3 ga3c.py --rows ga3c-static --seconds 30 --warmup 20 --out $W/r/ga3c_eager.json > $W/ga3c_eager.log 2>&1; pack
timeout 95 python3 ga3c.py --rows ga3c-static --cuda-graph --seconds 30 --warmup 20 --out $W/r/ga3c_graph.json \
  > $W/ga3c_graph.log 2>&1; pack
tail -n 15 $W/gpu_tests.log; cat $W/r/*.md
