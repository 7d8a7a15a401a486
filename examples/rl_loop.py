"""An RL loop whose methods are the phases: rollout, train, optimizer, weight_sync.

Run::

    python examples/rl_loop.py                    # 300 iterations, a little over 30 s
    python examples/rl_loop.py --iterations 20    # a short run (the smoke test)

A toy policy-gradient learner on a contextual bandit: a frozen copy of the policy
generates rollouts, the learner takes a REINFORCE step and the new weights are synced
back to the rollout copy, as in actor/learner RL setups. Each rollout waits
``ENV_LATENCY`` (0.1 s) for its environment, as real rollouts wait for a simulator or a
generation server; the default run therefore spans three of the default 10 s metric
export intervals, so Prometheus holds several points of every series and the RL
dashboard's rates have data to work on (one export interval gives one point, and
``rate()`` needs two).

``instrument()`` maps each method to a phase and ``run_iteration`` to a step; the mean
reward of every iteration is recorded as a user scalar (the ``otel_train.scalar`` gauge,
name="reward"). Exports over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, as the
service OTEL_SERVICE_NAME names, else "rl-loop" (``default_service_name``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

import otel_train

OBS, ACTIONS = 8, 4
ENV_LATENCY = 0.1  # seconds a rollout waits for its environment
ITERATIONS = 300  # x ENV_LATENCY: three default metric export intervals


class BanditLoop:
    def __init__(self, batch: int = 128, env_latency: float = ENV_LATENCY) -> None:
        torch.manual_seed(0)
        self.batch = batch
        self.env_latency = env_latency
        self.policy = torch.nn.Linear(OBS, ACTIONS)
        self.rollout_policy = copy.deepcopy(self.policy).requires_grad_(False)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=0.05)
        self.target = torch.randn(OBS, ACTIONS)  # the best action is argmax(obs @ target)

    def generate(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        obs = torch.randn(self.batch, OBS)
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=self.rollout_policy(obs))
            actions = dist.sample()
        time.sleep(self.env_latency)  # the environment answers the actions
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--iterations",
        type=int,
        default=ITERATIONS,
        help=f"iterations to run (default {ITERATIONS}, about {ITERATIONS * ENV_LATENCY:.0f} s)",
    )
    args = parser.parse_args(argv)
    if args.iterations < 20:
        parser.error("--iterations must be at least 20 (the reward is compared over 10)")
    loop = BanditLoop()
    otel_train.instrument(
        loop,
        phases={"rollout": "generate", "train": "train_step", "optimizer": "optim_step",
                "weight_sync": "sync_weights"},
        step="run_iteration",
        prometheus=False,
        console_every=100,
        default_service_name="rl-loop",
    )  # fmt: skip
    rewards = [loop.run_iteration() for _ in range(args.iterations)]
    print(
        f"{args.iterations} iterations; mean reward: first 10 {sum(rewards[:10]) / 10:.3f}, "
        f"last 10 {sum(rewards[-10:]) / 10:.3f}"
    )
    if not otel_train.shutdown():  # False: its deadline cut the export short
        sys.exit("rl_loop.py: otel_train.shutdown() missed its deadline; telemetry was lost")


if __name__ == "__main__":
    main()
