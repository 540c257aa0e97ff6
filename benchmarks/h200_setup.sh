# Source this at the start of a device command (H200 machine: Python 3.12, torch 2.11, no index).
# Installs the carried wheels (.whl: torchrl 0.14.1 & co; .whl-anchor: torchrl 0.11.1 for TorchRL's
# C++ sum tree) into /tmp and puts this checkout on PYTHONPATH. See ../shared/tools/device-wheels.sh.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || return 1
[ -d .whl-anchor ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/anchor .whl-anchor/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true
ANCHOR_PYTHONPATH=/tmp/anchor
