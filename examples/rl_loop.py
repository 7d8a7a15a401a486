"""An RL loop whose methods are the phases: rollout, train, optimizer, weight_sync.

Run::

    python examples/rl_loop.py                    # 300 iterations, a little over 30 s
    python examples/rl_loop.py --iterations 20    # a short run (the smoke test)
    python examples/rl_loop.py --generators 2     # rollouts made by 2 generator processes

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

With ``--generators N`` the rollout copies live in N processes of their own
(docs/processes.md), each its own otel-train session: service
``<trainer's service>-generator-<i>``, role ``generator``, the trainer's run id (set
here when no launcher gave one), so the RL dashboard's generator and staleness panels
and the trainer's report page (``rollout [generator]`` rows) find them. Each step hands
every generator ``otel_train.carrier(policy_version=k)`` with a request; the generator
makes the rollout in ``phase("rollout", parent=carrier)`` with the weights of version k
and sends it back with ``rollout.produced()``. The trainer trains on the rollouts
requested one step earlier (one-step off-policy: the generators make the next batch
while the trainer learns from the last), says so with ``otel_train.consumed(token,
policy_version=k)`` (staleness 1; 0 at the first step), and its ``weight_sync`` phase
puts the new weights on every generator's queue, which loads them in a remote
``weight_sync`` phase under the same step.
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import os
import sys
import time
import uuid
from typing import Any

import torch

import otel_train
from otel_train.identity import run_id

OBS, ACTIONS = 8, 4
ENV_LATENCY = 0.1  # seconds a rollout waits for its environment
ITERATIONS = 300  # x ENV_LATENCY: three default metric export intervals
PHASES = {"rollout": "generate", "train": "train_step", "optimizer": "optim_step",
          "weight_sync": "sync_weights"}  # fmt: skip
Rollout = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def rollout(policy: torch.nn.Module, target: torch.Tensor, n: int, latency: float) -> Rollout:
    """``n`` bandit rounds under ``policy``: observations, sampled actions, rewards."""
    obs = torch.randn(n, OBS)
    with torch.no_grad():
        actions = torch.distributions.Categorical(logits=policy(obs)).sample()
    time.sleep(latency)  # the environment answers the actions
    rewards = (actions == (obs @ target).argmax(dim=1)).float()
    return obs, actions, rewards


class BanditLoop:
    def __init__(self, batch: int = 128, env_latency: float = ENV_LATENCY) -> None:
        torch.manual_seed(0)
        self.batch = batch
        self.env_latency = env_latency
        self.policy = torch.nn.Linear(OBS, ACTIONS)
        self.rollout_policy = copy.deepcopy(self.policy).requires_grad_(False)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=0.05)
        self.target = torch.randn(OBS, ACTIONS)  # the best action is argmax(obs @ target)

    def generate(self) -> Rollout:
        return rollout(self.rollout_policy, self.target, self.batch, self.env_latency)

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

    def ask(self) -> None:
        """Ask for the next rollouts (made in this process: when generate() runs)."""

    def run_iteration(self) -> float:
        self.ask()
        obs, actions, rewards = self.generate()
        loss = self.train_step(obs, actions, rewards)
        self.optim_step()
        self.sync_weights()
        otel_train.record(reward=rewards.mean(), loss=loss)
        return float(rewards.mean())

    def close(self) -> None:
        return None


def generator_main(
    index: int, service: str, work: Any, results: Any, setup: dict[str, Any]
) -> None:
    """A generator process: rollouts and weight loads, each a remote phase under the
    carrier of the trainer's step that asked for it."""
    otel_train.configure(service_name=service, role="generator", console="off",
                         prometheus=False)  # fmt: skip
    torch.manual_seed(1 + index)
    policy = torch.nn.Linear(OBS, ACTIONS).requires_grad_(False)
    policy.load_state_dict(setup["weights"])
    results.put(None)  # ready: the trainer's first step does not wait for the start-up
    while (item := work.get()) is not None:
        kind, carrier, weights = item
        if kind == "sync":
            with otel_train.phase("weight_sync", parent=carrier):
                policy.load_state_dict(weights)
            continue
        with otel_train.phase("rollout", parent=carrier) as made:
            batch = rollout(policy, setup["target"], setup["batch"], setup["latency"])
        results.put((*batch, made.produced()))
    otel_train.shutdown()


class GeneratorLoop(BanditLoop):
    """The same learner with its rollouts made in ``generators`` processes."""

    def __init__(self, generators: int, service: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        ctx = mp.get_context("spawn")
        self.version = 0  # optimizer steps taken: the policy version
        self.waiting = 0  # rollouts each generator was asked for and has not handed over
        setup = {"weights": self.weights(), "target": self.target,
                 "batch": self.batch // generators, "latency": self.env_latency}  # fmt: skip
        self.queues = [(ctx.Queue(), ctx.Queue()) for _ in range(generators)]
        self.procs = [
            ctx.Process(target=generator_main, args=(i, f"{service}-generator-{i}", w, r, setup))
            for i, (w, r) in enumerate(self.queues)
        ]
        for p in self.procs:
            p.start()
        for _, results in self.queues:
            results.get(timeout=300)

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the weights (a queue pickles later, after further optimizer steps)."""
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def generate(self) -> Rollout:
        """The rollouts requested one step earlier (at the first step, this step's)."""
        got = [results.get(timeout=120) for _, results in self.queues]
        self.waiting -= 1
        for *_, token in got:  # made under version k, trained on at this one, j
            otel_train.consumed(token, policy_version=self.version)
        obs, actions, rewards = (torch.cat([g[i] for g in got]) for i in range(3))
        return obs, actions, rewards

    def sync_weights(self) -> None:
        self.version += 1
        carrier = otel_train.carrier(policy_version=self.version)
        for work, _ in self.queues:
            work.put(("sync", carrier, self.weights()))

    def ask(self) -> None:
        """The next batch from every generator, made while this step learns (two at the
        first step: one for it, one for the next)."""
        carrier = otel_train.carrier(policy_version=self.version)
        asks = 2 if self.version == 0 else 1
        for work, _ in self.queues:
            for _ in range(asks):
                work.put(("rollout", carrier, None))
        self.waiting += asks

    def close(self) -> None:
        for work, results in self.queues:
            work.put(None)
            for _ in range(self.waiting):  # the last step's request, never trained on
                results.get(timeout=120)
        for p in self.procs:
            p.join(60)
            if p.exitcode != 0:
                raise RuntimeError(f"generator {p.name} exited with {p.exitcode}")


def make_loop(generators: int) -> BanditLoop:
    if generators == 0:
        return BanditLoop()
    if run_id() is None:  # one run id for the trainer and its generators
        os.environ["OTEL_TRAIN_RUN_ID"] = uuid.uuid4().hex[:12]
    service = os.environ.get("OTEL_SERVICE_NAME") or "rl-loop"
    return GeneratorLoop(generators, service)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--iterations",
        type=int,
        default=ITERATIONS,
        help=f"iterations to run (default {ITERATIONS}, about {ITERATIONS * ENV_LATENCY:.0f} s)",
    )
    parser.add_argument(
        "--generators",
        type=int,
        default=0,
        help="generator processes making the rollouts (default 0: this process makes them)",
    )
    args = parser.parse_args(argv)
    if args.iterations < 20:
        parser.error("--iterations must be at least 20 (the reward is compared over 10)")
    if not 0 <= args.generators <= 8:
        parser.error("--generators must be 0 to 8")
    loop = make_loop(args.generators)
    role = {"role": "trainer"} if args.generators else {}
    otel_train.instrument(loop, phases=PHASES, step="run_iteration", prometheus=False,
                          console_every=100, default_service_name="rl-loop", **role)  # fmt: skip
    try:
        rewards = [loop.run_iteration() for _ in range(args.iterations)]
    finally:
        loop.close()
    print(
        f"{args.iterations} iterations; mean reward: first 10 {sum(rewards[:10]) / 10:.3f}, "
        f"last 10 {sum(rewards[-10:]) / 10:.3f}"
    )
    if not otel_train.shutdown():  # False: its deadline cut the export short
        sys.exit("rl_loop.py: otel_train.shutdown() missed its deadline; telemetry was lost")


if __name__ == "__main__":
    main()
