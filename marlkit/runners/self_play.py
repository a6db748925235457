"""Self-play between two teams: one learns, the other plays a past self from a pool (``self_play``
in a run's config, with ML-Agents' keys and meanings).

Every ``save_steps`` the learner's policy goes into the pool, which keeps the last ``window``.
Every ``swap_steps`` the frozen side gets a new opponent: the latest policy with probability
``play_against_latest_model_ratio``, else one of the pool's, uniformly. Every ``team_change`` the
other team learns. In a symmetric game (both teams' groups alike, in spaces and agents) one policy
plays either side: at a team change the learner's whole state (weights, optimiser, generators)
moves to the other team's groups, and both sides draw from one pool. In an asymmetric game each
team keeps its own learner and pool, and the side that does not learn plays its own past.

The frozen side acts with the snapshot's weights through the collector's acting copies, in this
process or in the env workers; its agent objects are not touched, so a team that stops learning
keeps its learner state for when its turn comes back. Every finished episode is a match: the
learner's Elo and the opponent's move by ``k`` times the surprise (``runners/elo.py``).

All of it (pool, ratings, schedule, the opponent in play, the draws that pick opponents) is plain
data in the run's checkpoint: a resumed run goes on exactly as one that did not stop. It changes
only at rollout boundaries, where a checkpoint is written. Each snapshot is also a file of the run
directory while the pool keeps it (``pool/<pool>_step<N>.pt``), which ``self_play.opponents`` takes
as a frozen reference (``save_snapshots``).
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

from marlkit.agents.base import Agent
from marlkit.config import SelfPlayConfig, to_plain
from marlkit.errors import ConfigError
from marlkit.runners.elo import elo_change, match_result


def _copied(weights):
    """A policy state, detached from the networks it came from."""
    return copy.deepcopy(weights)


class SelfPlay:
    """The league of a run (see the module's docstring): ``teams`` (team -> its groups, exactly two),
    ``agents`` (group -> its agent, all learning), ``seed`` for the opponents' draws."""

    def __init__(self, cfg: SelfPlayConfig, teams: dict[str, list[str]], agents: dict[str, Agent], seed: int):
        self.cfg, self.agents = cfg, agents
        check_teams_for_self_play(teams, agents)
        self.teams = teams
        self.names = list(teams)
        first, second = (teams[t] for t in self.names)
        self.symmetric = len(first) == len(second) and all(
            _alike(agents[a], agents[b]) for a, b in zip(first, second))
        self.agents_of = {g: list(agent.group.agents) for g, agent in agents.items()}
        # a pool per policy: one for a symmetric game, one per team otherwise
        self.keys = {t: "shared" if self.symmetric else t for t in self.names}
        self.learning = self.names[0]
        self.pool_dir: Path | None = None   # where the snapshots are files too (``save_snapshots``)
        self.env_name = ""
        self.elo = {key: cfg.initial_elo for key in set(self.keys.values())}
        self.pool: dict[str, list[dict]] = {key: [] for key in self.elo}
        for t in (self.names[:1] if self.symmetric else self.names):
            self._save(t, steps=0)
        self.rng = np.random.default_rng(seed)
        self.opponent: dict = {}
        self.next_save, self.next_swap, self.next_change = cfg.save_steps, cfg.swap_steps, cfg.team_change
        self.elo_curve: list[tuple[int, float]] = [(0, cfg.initial_elo)]
        self.matches = 0
        self._pick_opponent()

    # ------------------------------------------------------------------ who plays

    @property
    def other(self) -> str:
        return self.names[1 - self.names.index(self.learning)]

    def learning_groups(self) -> list[str]:
        return list(self.teams[self.learning])

    def seat_policies(self, team: str) -> dict[str, Agent]:
        """The learner's current policy playing ``team``'s groups: in a symmetric game the learning
        team's agents, position by position; otherwise that team's own agents."""
        if not self.symmetric or team == self.learning:
            return {g: self.agents[g] for g in self.teams[team]}
        return dict(zip(self.teams[team], (self.agents[g] for g in self.teams[self.learning])))

    def _policy_of(self, team: str) -> list:
        """The current policy of ``team``'s side, per position (its learner's weights, copied)."""
        return [_copied(agent.policy_state_dict()) for agent in self.seat_policies(team).values()]

    def _save(self, team: str, steps: int) -> None:
        key = self.keys[team]
        self.pool[key].append({"step": steps, "elo": self.elo[key], "weights": self._policy_of(team)})
        if self.pool_dir is not None:
            for gone in self.pool[key][:-self.cfg.window]:
                self._snapshot_path(key, gone["step"]).unlink(missing_ok=True)
        del self.pool[key][:-self.cfg.window]
        self.save_snapshots()

    def _snapshot_path(self, key: str, step: int) -> Path:
        return self.pool_dir / f"{key}_step{step}.pt"

    def save_snapshots(self, run_dir: Path | None = None, env_name: str | None = None) -> None:
        """The pool's snapshots as files of ``run_dir``/pool (from then on, each as it comes): per
        group the snapshot's weights, as a run checkpoint holds a group's, so that a snapshot is a
        frozen reference opponent; in a symmetric game for the groups of both teams."""
        if run_dir is not None:
            self.pool_dir, self.env_name = Path(run_dir) / "pool", env_name or ""
            self.pool_dir.mkdir(exist_ok=True)
            kept = {self._snapshot_path(key, e["step"]) for key, entries in self.pool.items() for e in entries}
            for path in self.pool_dir.glob("*.pt"):   # saved after the checkpoint a run resumes from
                if path not in kept:
                    path.unlink()
        if self.pool_dir is None:
            return
        for key, entries in self.pool.items():
            teams = [t for t in self.names if self.keys[t] == key]
            for entry in entries:
                path = self._snapshot_path(key, entry["step"])
                if path.is_file():
                    continue
                groups = {}
                for team in teams:
                    for g, weights in zip(self.teams[team], entry["weights"]):
                        agent = self.agents[g]
                        groups[g] = {"agent": agent.registered_name, "group": agent.group.signature(),
                                     "config": to_plain(agent.cfg), "policy": weights}
                tmp = path.with_suffix(".tmp")
                torch.save({"env_name": self.env_name, "step": entry["step"], "elo": entry["elo"], "groups": groups},
                           tmp)
                tmp.replace(path)

    def _pick_opponent(self) -> None:
        """The frozen side's next policy: the latest with probability ``play_against_latest_model_ratio``,
        else one of the pool's, uniformly."""
        key = self.keys[self.other]
        draw, which = self.rng.random(), int(self.rng.integers(len(self.pool[key])))
        if draw < self.cfg.play_against_latest_model_ratio:
            self.opponent = {"step": None, "elo": self.elo[key], "weights": self._policy_of(self.other)}
        else:
            entry = self.pool[key][which]
            self.opponent = {"step": entry["step"], "elo": entry["elo"], "weights": entry["weights"]}

    def install(self, collector, learner) -> None:
        """The collector acts with the opponent's weights for the frozen side and keeps the learning
        side's acting copies up to date; the learner updates the learning side alone."""
        learner.learning_groups = self.learning_groups()
        collector.synced = self.learning_groups()
        for g in self.learning_groups():
            collector.set_policy(g, self.agents[g].policy_state_dict())
        for g, weights in zip(self.teams[self.other], self.opponent["weights"]):
            collector.set_policy(g, weights)

    # ------------------------------------------------------------------ at a rollout boundary

    def after_rollout(self, steps: int, episodes: list[dict], collector, learner) -> dict[str, float]:
        """The rollout's finished ``episodes`` rated as matches, then the pool, the opponent and the
        learning side moved on as the schedule says at ``steps`` -> metrics to log."""
        key, theirs = self.keys[self.learning], self.keys[self.other]
        for episode in episodes:
            result = match_result(episode, self.teams[self.learning], self.teams[self.other], self.agents_of,
                                  self.cfg.outcome)
            if result is None:
                continue
            change = elo_change(self.elo[key], self.opponent["elo"], result, self.cfg.k)
            self.elo[key] += change
            self.opponent["elo"] -= change
            for entry in self.pool[theirs]:
                if entry["step"] == self.opponent["step"]:
                    entry["elo"] = self.opponent["elo"]
            self.matches += 1
        self.elo_curve.append((steps, self.elo[key]))
        changed = False
        if steps >= self.next_save:
            self._save(self.learning, steps)
            self.next_save = steps + self.cfg.save_steps
        if steps >= self.next_change:
            self._change_team(steps)
            self.next_change = steps + self.cfg.team_change
            changed = True
        if changed or steps >= self.next_swap:
            self._pick_opponent()
            self.next_swap = steps + self.cfg.swap_steps
            self.install(collector, learner)
        return {"self_play/elo": self.elo[key], "self_play/opponent_elo": self.opponent["elo"],
                "self_play/pool": float(len(self.pool[theirs]))}

    def _change_team(self, steps: int) -> None:
        """The other team learns from now on. Symmetric: the learner's whole state moves to its groups
        (position by position). Asymmetric: the team that stops keeps its state, and its policy as it
        stops joins its pool."""
        stopping, starting = self.teams[self.learning], self.teams[self.other]
        if self.symmetric:
            for src, dst in zip(stopping, starting):
                state = self.agents[src].state_dict()
                # the groups differ in name alone (checked alike): the state fits as it is
                self.agents[dst].load_state_dict({**state, "group": self.agents[dst].group.signature()})
        elif self.pool[self.keys[self.learning]][-1]["step"] != steps:
            self._save(self.learning, steps)
        self.learning = self.other

    # ------------------------------------------------------------------ saved with the run

    def state_dict(self) -> dict:
        return {"learning": self.learning, "elo": dict(self.elo), "pool": _copied(self.pool),
                "opponent": _copied(self.opponent), "rng": self.rng.bit_generator.state,
                "next": [self.next_save, self.next_swap, self.next_change], "elo_curve": list(self.elo_curve),
                "matches": self.matches}

    def load_state_dict(self, state: dict) -> None:
        self.learning, self.elo, self.pool = state["learning"], dict(state["elo"]), _copied(state["pool"])
        self.opponent = _copied(state["opponent"])
        self.rng.bit_generator.state = state["rng"]
        self.next_save, self.next_swap, self.next_change = state["next"]
        self.elo_curve, self.matches = [tuple(p) for p in state["elo_curve"]], state["matches"]

    def summary(self) -> dict:
        """For the report: the ratings, the pool's (step and Elo of each snapshot), the Elo curve."""
        return {"symmetric": self.symmetric, "learning_team": self.learning, "k": self.cfg.k, "elo": dict(self.elo),
                "matches": self.matches,
                "pool": {key: [{"step": e["step"], "elo": e["elo"]} for e in entries]
                         for key, entries in self.pool.items()},
                "elo_curve": [list(p) for p in self.elo_curve]}


def _alike(a: Agent, b: Agent) -> bool:
    """Two groups one policy can play: the same agent class and settings, the same spaces and number
    of agents (their names may differ)."""
    sa, sb = a.group.signature(), b.group.signature()
    return (type(a) is type(b) and a.cfg == b.cfg and len(sa["agents"]) == len(sb["agents"])
            and sa["observation_space"] == sb["observation_space"] and sa["action_space"] == sb["action_space"])


def check_teams_for_self_play(teams: dict[str, list[str]], agents: dict[str, Agent]) -> None:
    """Refuse, in one line, a run self-play cannot rate: other than two teams, or a group whose
    agent does not learn."""
    if len(teams) != 2:
        found = "; ".join(f"{t}: {', '.join(m)}" for t, m in teams.items())
        why = ("one team has no rival to play" if len(teams) < 2 else
               "one learns while the other plays its past, and a rating of three sides or more is not kept")
        raise ConfigError(f"self_play plays two teams, but this env has {len(teams)} ({found}): {why}; set env.teams "
                          "to two teams, or train without self_play")
    still = [g for g, agent in agents.items() if not agent.learns]
    if still:
        raise ConfigError(f"self_play: group {still[0]!r} is played by {agents[still[0]].registered_name}, which does "
                          f"not learn; remove groups.{still[0]}.agent (a fixed opponent goes in self_play.opponents)")
