# Device call 1: environment, eager-step profile, GPU tests, kernel benchmark. Results under $OUT.
source benchmarks/h200_setup.sh || exit 1
cd benchmarks
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c 'import torch, triton, torchrl, tensordict, lightning; print(torch.__version__, triton.__version__, torchrl.__version__, tensordict.__version__, lightning.__version__, torch.cuda.device_count())'; } > $OUT/env.txt 2>&1
timeout 90 python3 profile_step.py --capacity 1000000 --batch 256 --out $OUT/profile.txt > /dev/null 2> $OUT/profile.err
cd ..
timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning > $OUT/pytest_gpu.log 2>&1
cd benchmarks
timeout 150 python3 replay_kernels.py --sizes 1e6,1e7,1e8 --batches 256 --out $OUT/kernels.json > $OUT/kernels.log 2>&1
tail -5 $OUT/pytest_gpu.log; cat $OUT/kernels.log | tail -30; tail -3 $OUT/profile.err
