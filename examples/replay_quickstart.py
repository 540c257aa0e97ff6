"""Prioritized replay on the GPU in a plain PyTorch loop (no Lightning): extend, sample, update.

    python examples/replay_quickstart.py            # CUDA if available, else CPU
"""

import torch
from tensordict import TensorDict

from lightning_per import make_replay_buffer

torch.set_num_threads(1)  # one intra-op thread: docs/replay.md "On a CPU" (more threads than cores slow it down)
torch.manual_seed(0)  # the network and the pretend environment; the buffer draws from its own generator
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
rb = make_replay_buffer(100_000, 256, sampler="proportional", device=device, alpha=0.6, beta=0.4,
                        generator=torch.Generator().manual_seed(0))
q = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.Adam(q.parameters(), lr=1e-3)

for step in range(1_000):
    # pretend environment: 16 transitions per step, already on the device
    obs = torch.randn(16, 4, device=device)
    rb.extend(TensorDict({"observation": obs, "action": torch.randint(0, 2, (16,), device=device),
                          "reward": obs.sum(-1)}, [16], device=device))
    if len(rb) < 1_000:
        continue
    batch = rb.sample()                                    # [256] on the device
    q_sa = q(batch["observation"]).gather(1, batch["action"][:, None]).squeeze(1)
    td_error = batch["reward"] - q_sa                      # toy target
    loss = (batch["priority_weight"] * td_error.pow(2)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    rb.update_priority(batch["index"], td_error.detach().abs())   # no host sync
    rb.sampler.beta = min(1.0, 0.4 + 0.6 * step / 1_000)         # anneal beta

print(f"buffer holds {len(rb)} transitions on {device}; last loss {loss.item():.4f}")  # one sync, at the end
