"""Environment factories (Gymnasium / ALE through TorchRL) and batched pure-torch environments."""

from lightning_per.envs.factory import EnvConfig, make_env, restore_env, snapshot_env
from lightning_per.envs.torch_cartpole import TorchCartPoleEnv

__all__ = ["EnvConfig", "TorchCartPoleEnv", "make_env", "restore_env", "snapshot_env"]
