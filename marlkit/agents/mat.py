"""MAT: the Multi-Agent Transformer (Wen et al., 2022).

An encoder attends over the observations of all agents of a group and gives each agent a
representation and a value; a decoder picks the actions agent by agent, each one conditioned on the
actions already picked for the agents before it (causal self-attention over the shifted actions,
opened by a start token) and on the representations. Acting decodes sequentially (batched over
envs: the only Python loop is over agents); training evaluates every agent in one teacher-forced
pass over the stored joint action, trained with PPO's clipped surrogate, the value loss on the
encoder's values and an entropy bonus.

Absent agents (``agent_mask`` False) are masked out of the encoder's attention, and each env's
decoding order puts the present agents first (in slot order) and the absent ones after them, with
the fixed no-action token: the causal mask then keeps an absent agent from influencing any present
one, so a present agent is decoded exactly as if the absent slots did not exist.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from marlkit.agents.on_policy import OnPolicyAgent, OnPolicyConfig
from marlkit.config import RunnerConfig
from marlkit.errors import ConfigError
from marlkit.networks.distributions import ActionHead
from marlkit.networks.mlp import flat_size
from marlkit.networks.transformer import ActionTokens, MATDecoder, MATEncoder
from marlkit.registry import register_agent


@dataclass
class MATConfig(OnPolicyConfig):
    """OnPolicyConfig (the PPO settings) plus the transformer's size; the defaults are the paper's
    (its MPE runs also use ``clip: 0.05`` for ratio and value, set in ``mpe_spread.yaml`` with
    64 envs per update). ``value_clip`` clips the encoder's values as PPO's clip does the ratio."""

    n_block: int = field(default=1, metadata={"min": 1})     # encoder blocks, and as many decoder blocks
    n_embd: int = field(default=64, metadata={"min": 1})     # embedding width of every token
    n_head: int = field(default=1, metadata={"min": 1})      # attention heads; must divide n_embd
    use_agent_id: bool = False


# OnPolicyConfig settings that belong to MAPPO-style actor/critic networks and mean nothing here
_NOT_USED = {"actor": "the encoder and decoder are set by n_block, n_embd and n_head",
             "critic": "the values come from the encoder (n_block, n_embd, n_head)",
             "critic_lr": "actor and critic share the encoder, so one optimiser and one lr train both",
             "chunk_length": "MAT is not recurrent",
             "use_agent_id": "agents are told apart by their observations and their place in the decoding order"}


@dataclass
class Evaluation:
    """Teacher-forced outputs for ``[N, A]`` agents, in slot order."""

    log_prob: torch.Tensor   # [N, A] of the given actions
    entropy: torch.Tensor    # [N, A]
    value: torch.Tensor      # [N, A], normalised


@register_agent("MAT")
class MAT(OnPolicyAgent):
    """MAT: transformer encoder over a group's observations, autoregressive decoder over its actions.

    One network for the whole group whatever its size (no per-agent weights, no position
    embeddings). Discrete, MultiDiscrete (one token per agent with a one-hot per branch, branches
    independent given the previous agents) and Box actions; observations of any shape are flattened.
    The global state is not used.
    """

    config_cls = MATConfig

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        return False   # the global state is never read

    @classmethod
    def check_config(cls, cfg: MATConfig, rc: RunnerConfig, key: str) -> None:
        defaults = MATConfig()
        for f in fields(OnPolicyConfig):
            if f.name in _NOT_USED and getattr(cfg, f.name) != getattr(defaults, f.name):
                raise ConfigError(f"{key}.{f.name}: MAT does not use this setting ({_NOT_USED[f.name]}); "
                                  "remove it")
        if cfg.n_embd % cfg.n_head:
            raise ConfigError(f"{key}: n_head={cfg.n_head} must divide n_embd={cfg.n_embd}")

    # ------------------------------------------------------------------ networks

    def build(self) -> dict[str, nn.Module]:
        cfg, space = self.cfg, self.group.action_space
        if isinstance(space, spaces.Discrete):
            nvec = [int(space.n)]
        elif isinstance(space, spaces.MultiDiscrete):
            nvec = [int(n) for n in np.asarray(space.nvec).reshape(-1)]
        else:
            nvec = None
        self.tokens = ActionTokens(nvec, flat_size(space.shape) if nvec is None else 0)
        return {"encoder": MATEncoder(flat_size(self.group.obs_shape), cfg.n_block, cfg.n_embd, cfg.n_head),
                "decoder": MATDecoder(self.tokens.dim, cfg.n_block, cfg.n_embd, cfg.n_head),
                "head": ActionHead(space, cfg.n_embd, cfg.log_std_init)}

    def encode(self, obs: torch.Tensor, present: torch.Tensor):
        """``[N, A, *obs_shape]`` -> (normalised values ``[N, A]``, representations ``[N, A, E]``);
        absent slots read zeros, so nothing they hold (even inf or NaN) enters the network."""
        obs = obs.reshape(*obs.shape[:2], -1).float()
        return self.modules["encoder"](torch.where(present.unsqueeze(-1), obs, 0.0), present)

    @staticmethod
    def decoding_order(present: torch.Tensor) -> torch.Tensor:
        """``[N, A]`` slot indices: the present agents in slot order, then the absent ones."""
        return torch.argsort((~present).to(torch.uint8), dim=1, stable=True)

    @staticmethod
    def gather(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """``x [N, A, ...]`` rearranged so that position p holds slot ``order[:, p]``."""
        index = order.reshape(*order.shape, *[1] * (x.dim() - 2)).expand(*order.shape, *x.shape[2:])
        return x.gather(1, index)

    @staticmethod
    def scatter(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """The inverse of ``gather``: back from decoding order to slot order."""
        index = order.reshape(*order.shape, *[1] * (x.dim() - 2)).expand(*order.shape, *x.shape[2:])
        return torch.empty_like(x).scatter_(1, index, x)

    # ------------------------------------------------------------------ acting

    def sample(self, obs, state, agent_mask, action_mask, hidden, explore: bool, noise):
        """Autoregressive decoding of ``[1, E, A, ...]`` inputs, one agent position at a time for all
        envs together; absent slots get action 0 (zeros for Box) and log-prob 0."""
        present = agent_mask[0].bool()
        E, A = present.shape
        value, rep = self.encode(obs[0], present)
        order = self.decoding_order(present)
        rep, present_o = self.gather(rep, order), self.gather(present, order)
        mask = self.gather(action_mask[0], order) if action_mask is not None else None
        decoder, head = self.modules["decoder"], self.modules["head"]
        decoding = decoder.start(rep)
        token = self.tokens.start(E, rep)
        actions, log_probs = [], []
        noise = noise.along(0)   # the distributions below are over [E, ...]
        for p in range(A):
            dist = head(decoder.step(token, decoding, p), mask[:, p] if mask is not None else None)
            action = dist.sample(noise) if explore else dist.mode()
            live = present_o[:, p]
            action = torch.where(live.reshape(-1, *[1] * (action.dim() - 1)), action, torch.zeros_like(action))
            actions.append(action)
            log_probs.append(torch.where(live, dist.log_prob(action), 0.0))
            token = self.tokens(action, live)
        action = self.scatter(torch.stack(actions, 1), order)
        log_prob = self.scatter(torch.stack(log_probs, 1), order)
        return action.unsqueeze(0), log_prob.unsqueeze(0), None, value.unsqueeze(0)

    # ------------------------------------------------------------------ learning

    def evaluate(self, obs: torch.Tensor, agent_mask: torch.Tensor, action_mask: torch.Tensor | None,
                 actions: torch.Tensor) -> Evaluation:
        """One teacher-forced pass over ``[N, A, ...]`` joint actions: the log-probs that decoding
        would have given them, the entropies and the values (what absent slots get means nothing)."""
        present = agent_mask.bool()
        N, A = present.shape
        value, rep = self.encode(obs, present)
        order = self.decoding_order(present)
        rep, present_o, actions_o = self.gather(rep, order), self.gather(present, order), self.gather(actions, order)
        tokens = torch.cat([self.tokens.start(N, rep).unsqueeze(1),
                            self.tokens(actions_o[:, :-1], present_o[:, :-1])], 1)
        mask = self.gather(action_mask, order) if action_mask is not None else None
        dist = self.modules["head"](self.modules["decoder"](tokens, rep), mask)
        safe = torch.where(present_o.reshape(N, A, *[1] * (actions_o.dim() - 2)), actions_o,
                           torch.zeros_like(actions_o))
        return Evaluation(self.scatter(dist.log_prob(safe), order), self.scatter(dist.entropy(), order), value)

    @torch.no_grad()
    def value_of(self, obs: np.ndarray, state: np.ndarray, agent_mask: np.ndarray, hidden) -> np.ndarray:
        """Real-scale values ``[N, A]`` from the encoder (the state is not read)."""
        values = [self._denormalize(self.encode(self.tensor(obs[part]), self.tensor(agent_mask[part]))[0]).cpu().numpy()
                  for part in self.chunks(len(obs), obs[:1].nbytes)]
        return np.concatenate(values) if values else np.zeros((0, self.n_agents), np.float32)

    def loss(self, batch):
        lead = batch["agent_mask"].shape        # [L, B, A]
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731  [L, B, A, ...] -> [L * B, A, ...]
        action_mask = flat(batch["action_mask"]) if self.group.n_actions else None
        out = self.evaluate(flat(batch["obs"]), flat(batch["agent_mask"]), action_mask, flat(batch["actions"]))
        log_prob, entropy, value = (x.reshape(lead) for x in (out.log_prob, out.entropy, out.value))
        return self.ppo_loss(batch, log_prob, lambda: entropy, lambda: value)
