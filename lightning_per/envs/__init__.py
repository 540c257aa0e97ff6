"""Environment factories (Gymnasium / ALE through TorchRL), batched pure-torch environments, and their checked
snapshots for checkpoints."""

from lightning_per.envs.factory import EnvConfig, check_checkpoint_env_id, make_env
from lightning_per.envs.snapshot import check_env_state, restore_env, snapshot_env
from lightning_per.envs.torch_cartpole import TorchCartPoleEnv

__all__ = ["EnvConfig", "TorchCartPoleEnv", "check_checkpoint_env_id", "check_env_state", "make_env", "restore_env",
           "snapshot_env"]
