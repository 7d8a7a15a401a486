"""An RL loop whose methods are the phases: rollout, train, optimizer, weight_sync.

Run::

    python examples/rl_loop.py

A toy policy-gradient learner on a contextual bandit: a frozen copy of the policy
generates rollouts, the learner takes a REINFORCE step and the new weights are synced
back to the rollout copy, as in actor/learner RL setups. ``instrument()`` maps each
method to a phase and ``run_iteration`` to a step; the mean reward of every iteration
is recorded as a user scalar (the ``otel_train.scalar`` gauge, name="reward").
Exports over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.
"""

from __future__ import annotations

import copy

import torch

import otel_train

OBS, ACTIONS = 8, 4


class BanditLoop:
    def __init__(self, batch: int = 128) -> None:
        torch.manual_seed(0)
        self.batch = batch
        self.policy = torch.nn.Linear(OBS, ACTIONS)
        self.rollout_policy = copy.deepcopy(self.policy).requires_grad_(False)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=0.05)
        self.target = torch.randn(OBS, ACTIONS)  # the best action is argmax(obs @ target)

    def generate(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        obs = torch.randn(self.batch, OBS)
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=self.rollout_policy(obs))
            actions = dist.sample()
        rewards = (actions == (obs @ self.target).argmax(dim=1)).float()
        return obs, actions, rewards

    def train_step(
        self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor
    ) -> torch.Tensor:
        dist = torch.distributions.Categorical(logits=self.policy(obs))
        advantage = rewards - rewards.mean()
        loss = -(dist.log_prob(actions) * advantage).mean()
        self.opt.zero_grad()
        loss.backward()
        return loss.detach()

    def optim_step(self) -> None:
        self.opt.step()

    def sync_weights(self) -> None:
        self.rollout_policy.load_state_dict(self.policy.state_dict())

    def run_iteration(self) -> float:
        obs, actions, rewards = self.generate()
        loss = self.train_step(obs, actions, rewards)
        self.optim_step()
        self.sync_weights()
        otel_train.record(reward=rewards.mean(), loss=loss)
        return float(rewards.mean())


def main() -> None:
    loop = BanditLoop()
    otel_train.instrument(
        loop,
        phases={"rollout": "generate", "train": "train_step", "optimizer": "optim_step",
                "weight_sync": "sync_weights"},
        step="run_iteration",
        prometheus=False,
        console_every=10,
        service_name="rl-loop",
    )  # fmt: skip
    rewards = [loop.run_iteration() for _ in range(40)]
    print(
        f"mean reward: first 10 iterations {sum(rewards[:10]) / 10:.3f}, "
        f"last 10 {sum(rewards[-10:]) / 10:.3f}"
    )
    otel_train.shutdown()


if __name__ == "__main__":
    main()
